//! Webhook: the configurations exist and trust the serving certificate in the webhook's
//! Secret, that certificate has time left, the Service has Ready endpoints, and the whole path
//! API server → webhook works (`probe.rs`).

mod probe;

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
        },
        core::v1::{Endpoints, Secret, Service},
        discovery::v1::EndpointSlice,
    },
};
use kube::{Api, Client, api::ListParams};
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};

use super::{
    report::{Check, Group},
    target::{Install, Target, api_message, is_not_found, names},
};

/// Under this much validity left the certificate check warns: cert-manager renews at two
/// thirds of 90 days (30 days left), so a certificate this close to its end was not renewed.
pub const RENEW_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// What the cert-manager group needs from the webhook group.
#[derive(Debug, Default)]
pub struct Configurations {
    /// `cert-manager.io/inject-ca-from` of the mutating and the validating configuration.
    pub inject_ca_from: Vec<(&'static str, Option<String>)>,
}

/// The Webhook group, and what the cert-manager group reads of the configurations.
pub async fn checks(
    client: &Client,
    target: &Target,
    crd_installed: bool,
) -> (Group, Configurations) {
    let mut checks = Vec::new();
    let mut configurations = Configurations::default();
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(names::WEBHOOK_CONFIGURATION)
        .await;
    let mutating = configuration(
        &mut checks,
        &mut configurations,
        "mutating",
        "MutatingWebhookConfiguration",
        mutating.map(|c| {
            c.map(|c| {
                let annotation = inject_ca_from(&c.metadata);
                let hooks = c.webhooks.into_iter().flatten();
                (
                    annotation,
                    hooks.map(|w| (w.name, w.client_config)).collect(),
                )
            })
        }),
    );
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get_opt(names::WEBHOOK_CONFIGURATION)
        .await;
    let validating = configuration(
        &mut checks,
        &mut configurations,
        "validating",
        "ValidatingWebhookConfiguration",
        validating.map(|c| {
            c.map(|c| {
                let annotation = inject_ca_from(&c.metadata);
                let hooks = c.webhooks.into_iter().flatten();
                (
                    annotation,
                    hooks.map(|w| (w.name, w.client_config)).collect(),
                )
            })
        }),
    );

    let chain = match &target.install {
        Install::Dev { serving_chain } => dev_chain(&mut checks, serving_chain, &target.namespace),
        Install::Cluster => secret_chain(&mut checks, client, &target.namespace).await,
    };
    if let Some(chain) = &chain {
        let host = format!("{}.{}.svc", names::WEBHOOK_SERVICE, target.namespace);
        for (kind, configuration) in [
            ("MutatingWebhookConfiguration", &mutating),
            ("ValidatingWebhookConfiguration", &validating),
        ] {
            for hook in configuration.iter().flat_map(|c| &c.hooks) {
                let fix = bundle_fix(target, configuration.as_ref());
                checks.push(ca_bundle_check(kind, hook, chain, &host, fix));
            }
        }
        checks.push(validity_check(chain, &target.namespace));
    }
    if target.is_dev() {
        checks.push(Check::skip(
            "webhook.endpoints",
            "dev routes the webhook Service to its own listener: there are no pods or endpoints to check",
        ));
    } else {
        checks.push(endpoints_check(client, &target.namespace).await);
    }
    if crd_installed {
        checks.extend(probe::checks(client, target).await);
    } else {
        checks.push(Check::skip(
            "webhook.dry-run",
            "the dry-run MyApps need the CRD: skipped",
        ));
    }
    (
        Group {
            name: "Webhook",
            checks,
        },
        configurations,
    )
}

/// The certificate chain the dev process serves, from its marker.
fn dev_chain(
    checks: &mut Vec<Check>,
    pem: &str,
    namespace: &str,
) -> Option<Vec<CertificateDer<'static>>> {
    let chain = pem_chain(pem.as_bytes());
    if chain.is_empty() {
        checks.push(Check::fail(
            "webhook.secret",
            format!(
                "the ConfigMap {namespace}/{} holds no PEM certificate in tls.crt",
                names::DEV_MARKER
            ),
            "restart myapp-operator dev: it writes the certificate its webhook serves",
            "webhook",
        ));
        return None;
    }
    checks.push(Check::skip(
        "webhook.secret",
        format!(
            "dev serves its certificate from its state directory, not a Secret: checked from the ConfigMap {namespace}/{}",
            names::DEV_MARKER
        ),
    ));
    Some(chain)
}

/// The certificates of a PEM chain, leaf first; what does not parse is left out (an empty
/// chain is the caller's failure to report).
fn pem_chain(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

/// The certificate chain the pods serve: `tls.crt` of the Secret they mount.
async fn secret_chain(
    checks: &mut Vec<Check>,
    client: &Client,
    namespace: &str,
) -> Option<Vec<CertificateDer<'static>>> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    match secrets.get_opt(names::WEBHOOK_SECRET).await {
        Ok(Some(secret)) => serving_chain(checks, &secret, namespace),
        Ok(None) => {
            checks.push(Check::fail(
                "webhook.secret",
                format!(
                    "the Secret {namespace}/{} with the webhook's serving certificate does not exist",
                    names::WEBHOOK_SECRET
                ),
                format!(
                    "cert-manager issues it from the Certificate {namespace}/{}: kubectl -n {namespace} describe certificate {}; without cert-manager, create it from myapp-operator certs (see Without cert-manager)",
                    names::CERTIFICATE,
                    names::CERTIFICATE
                ),
                "webhook",
            ));
            None
        }
        Err(error) => {
            checks.push(Check::fail(
                "webhook.secret",
                format!(
                    "the Secret {namespace}/{} cannot be read: {}",
                    names::WEBHOOK_SECRET,
                    api_message(&error)
                ),
                "run check as a user who may get secrets in the operator's namespace",
                "webhook",
            ));
            None
        }
    }
}

fn inject_ca_from(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<String> {
    meta.annotations
        .as_ref()?
        .get("cert-manager.io/inject-ca-from")
        .cloned()
}

type Fetched = Result<Option<(Option<String>, Vec<(String, WebhookClientConfig)>)>, kube::Error>;

/// One webhook configuration, as the caBundle checks read it.
struct Configuration {
    /// Whether it asks cert-manager's CA injector for its caBundle.
    injected: bool,
    /// Its webhooks: each entry's `name` and `caBundle`.
    hooks: Vec<(String, Option<ByteString>)>,
}

/// Checks one configuration exists, and returns it.
fn configuration(
    checks: &mut Vec<Check>,
    configurations: &mut Configurations,
    id: &'static str,
    kind: &str,
    fetched: Fetched,
) -> Option<Configuration> {
    let id_exists = format!("webhook.configuration.{id}");
    match fetched {
        Ok(Some((annotation, hooks))) if !hooks.is_empty() => {
            checks.push(Check::ok(
                id_exists,
                format!("the {kind} {} exists", names::WEBHOOK_CONFIGURATION),
            ));
            let injected = annotation.is_some();
            configurations.inject_ca_from.push((id, annotation));
            Some(Configuration {
                injected,
                hooks: hooks
                    .into_iter()
                    .map(|(name, client)| (name, client.ca_bundle))
                    .collect(),
            })
        }
        Ok(Some(_)) => {
            checks.push(Check::fail(
                id_exists,
                format!(
                    "the {kind} {} has no webhooks",
                    names::WEBHOOK_CONFIGURATION
                ),
                "kubectl apply -k deploy/ (or deploy/without-cert-manager/)",
                "webhook",
            ));
            None
        }
        Ok(None) => {
            checks.push(Check::fail(
                id_exists,
                format!(
                    "the {kind} {} does not exist: MyApps are neither validated nor defaulted",
                    names::WEBHOOK_CONFIGURATION
                ),
                "kubectl apply -k deploy/ (cert-manager then injects its caBundle), or deploy/without-cert-manager/ with your CA",
                "webhook",
            ));
            None
        }
        Err(error) => {
            checks.push(Check::fail(
                id_exists,
                format!(
                    "the {kind} {} cannot be read: {}",
                    names::WEBHOOK_CONFIGURATION,
                    api_message(&error)
                ),
                "run check as a user who may get webhook configurations",
                "webhook",
            ));
            None
        }
    }
}

/// The certificate chain in the Secret's `tls.crt`, leaf first.
fn serving_chain(
    checks: &mut Vec<Check>,
    secret: &Secret,
    namespace: &str,
) -> Option<Vec<CertificateDer<'static>>> {
    let pem = secret
        .data
        .as_ref()
        .and_then(|d| d.get("tls.crt"))
        .map(|ByteString(b)| b.as_slice())
        .unwrap_or_default();
    let chain = pem_chain(pem);
    if chain.is_empty() {
        checks.push(Check::fail(
            "webhook.secret",
            format!(
                "the Secret {namespace}/{} holds no PEM certificate in tls.crt",
                names::WEBHOOK_SECRET
            ),
            format!(
                "let cert-manager re-issue it: kubectl -n {namespace} delete secret {}",
                names::WEBHOOK_SECRET
            ),
            "webhook",
        ));
        return None;
    }
    checks.push(Check::ok(
        "webhook.secret",
        format!(
            "the Secret {namespace}/{} holds the serving certificate",
            names::WEBHOOK_SECRET
        ),
    ));
    Some(chain)
}

/// How a configuration's webhooks get their caBundle back.
fn bundle_fix(target: &Target, configuration: Option<&Configuration>) -> String {
    let namespace = &target.namespace;
    if target.is_dev() {
        return "restart myapp-operator dev: it installs the webhook configurations with the CA of the certificate it serves".into();
    }
    if configuration.is_some_and(|c| c.injected) {
        return format!(
            "cert-manager's CA injector sets caBundle on every webhook of a configuration annotated cert-manager.io/inject-ca-from: {namespace}/{}; look at its log: kubectl -n cert-manager logs deploy/cert-manager-cainjector",
            names::CERTIFICATE
        );
    }
    format!(
        "put the CA that signed the certificate in {namespace}/{} into deploy/without-cert-manager/ca.crt and run kubectl apply -k deploy/without-cert-manager: it sets caBundle on every webhook",
        names::WEBHOOK_SECRET
    )
}

/// Verifies the serving chain against one webhook's caBundle, for the name the API server
/// dials (`<service>.<namespace>.svc`).
fn ca_bundle_check(
    kind: &str,
    (name, bundle): &(String, Option<ByteString>),
    chain: &[CertificateDer<'static>],
    host: &str,
    fix: String,
) -> Check {
    let id = format!("webhook.ca-bundle.{name}");
    let of = format!("webhook {name} ({kind} {})", names::WEBHOOK_CONFIGURATION);
    let Some(ByteString(bundle)) = bundle.as_ref().filter(|b| !b.0.is_empty()) else {
        return Check::fail(
            id,
            format!(
                "{of} has no caBundle: the API server cannot trust the webhook and refuses every request it matches"
            ),
            fix,
            "webhook",
        );
    };
    match verify(bundle, chain, host) {
        Ok(()) => Check::ok(
            id,
            format!("the caBundle of {of} verifies the serving certificate for {host}"),
        ),
        Err(reason) => Check::fail(
            id,
            format!("the caBundle of {of} does not verify the serving certificate: {reason}"),
            fix,
            "webhook",
        ),
    }
}

/// Whether `ca_bundle` (PEM) verifies the serving chain `serving_chain` (PEM, leaf first) for
/// `host`, as the API server does when it calls the webhook. Validity is checked apart, so the
/// chain is verified at a moment the leaf is valid.
pub fn verifies(ca_bundle: &[u8], serving_chain: &[u8], host: &str) -> Result<(), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(serving_chain)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the serving chain is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err("the serving chain holds no certificate".into());
    }
    verify(ca_bundle, &chain, host)
}

fn verify(bundle: &[u8], chain: &[CertificateDer<'static>], host: &str) -> Result<(), String> {
    let at = webhook::tls::certificate_validity(&chain[0])
        .map(|(not_before, not_after)| unix_now().clamp(not_before, not_after))
        .unwrap_or_else(|_| unix_now());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(bundle) {
        let ca = ca.map_err(|e| format!("the caBundle is not PEM: {e}"))?;
        roots
            .add(ca)
            .map_err(|e| format!("the caBundle holds a bad certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the caBundle holds no certificate".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let time = UnixTime::since_unix_epoch(Duration::from_secs(at.max(0) as u64));
    verifier
        .verify_server_cert(&chain[0], &chain[1..], &name, &[], time)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn validity_check(chain: &[CertificateDer<'static>], namespace: &str) -> Check {
    const ID: &str = "webhook.certificate-validity";
    let renew = format!(
        "renew it: cmctl renew -n {namespace} {} (or delete the Secret {} for cert-manager to re-issue it); the pods reload it without a restart",
        names::CERTIFICATE,
        names::WEBHOOK_SECRET
    );
    let (not_before, not_after) = match webhook::tls::certificate_validity(&chain[0]) {
        Ok(validity) => validity,
        Err(reason) => {
            return Check::fail(
                ID,
                format!("the serving certificate does not parse: {reason}"),
                renew,
                "webhook",
            );
        }
    };
    let now = unix_now();
    let until = rfc3339(not_after);
    if now < not_before {
        return Check::fail(
            ID,
            format!(
                "the serving certificate is not valid before {}",
                rfc3339(not_before)
            ),
            "check the clocks of the nodes and of the issuer",
            "webhook",
        );
    }
    if now > not_after {
        return Check::fail(
            ID,
            format!("the serving certificate expired at {until}"),
            renew,
            "webhook",
        );
    }
    let left = Duration::from_secs((not_after - now) as u64);
    let days = left.as_secs() / 86_400;
    if left < RENEW_WARNING {
        return Check::warn(
            ID,
            format!(
                "the serving certificate expires in {days} days, at {until}: cert-manager should have renewed it"
            ),
            renew,
            "webhook",
        );
    }
    Check::ok(
        ID,
        format!("the serving certificate is valid until {until} ({days} days)"),
    )
}

/// Whether the webhook Service has a Ready endpoint, from its EndpointSlices (or, where those
/// are not served, its Endpoints).
async fn endpoints_check(client: &Client, namespace: &str) -> Check {
    const ID: &str = "webhook.endpoints";
    let service = names::WEBHOOK_SERVICE;
    let hint = format!(
        "kubectl -n {namespace} get pods -l app.kubernetes.io/name=myapp-operator: a pod is Ready when its webhook serves a valid certificate (/readyz)"
    );
    match Api::<Service>::namespaced(client.clone(), namespace)
        .get_opt(service)
        .await
    {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Check::fail(
                ID,
                format!("the Service {namespace}/{service} does not exist"),
                "kubectl apply -f deploy/base/services.yaml",
                "webhook",
            );
        }
        Err(error) => {
            return Check::fail(
                ID,
                format!(
                    "the Service {namespace}/{service} cannot be read: {}",
                    api_message(&error)
                ),
                hint,
                "webhook",
            );
        }
    }
    let counted = match ready_in_slices(client, namespace, service).await {
        Err(error) if is_not_found(&error) => ready_in_endpoints(client, namespace, service).await,
        counted => counted,
    };
    match counted {
        Ok((ready, _)) if ready > 0 => Check::ok(
            ID,
            format!("the Service {namespace}/{service} has {ready} Ready endpoint(s)"),
        ),
        Ok((_, not_ready)) => Check::fail(
            ID,
            format!(
                "the Service {namespace}/{service} has no Ready endpoint ({not_ready} not ready): every MyApp create and spec change fails"
            ),
            hint,
            "webhook",
        ),
        Err(error) => Check::fail(
            ID,
            format!(
                "the endpoints of {namespace}/{service} cannot be read: {}",
                api_message(&error)
            ),
            hint,
            "webhook",
        ),
    }
}

/// (Ready, not ready) addresses in the Service's EndpointSlices. A nil `ready` means ready.
async fn ready_in_slices(
    client: &Client,
    namespace: &str,
    service: &str,
) -> Result<(usize, usize), kube::Error> {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await?;
    let (mut ready, mut not_ready) = (0, 0);
    for endpoint in slices.items.iter().flat_map(|s| &s.endpoints) {
        let count = endpoint.addresses.len();
        if endpoint
            .conditions
            .as_ref()
            .and_then(|c| c.ready)
            .unwrap_or(true)
        {
            ready += count;
        } else {
            not_ready += count;
        }
    }
    Ok((ready, not_ready))
}

async fn ready_in_endpoints(
    client: &Client,
    namespace: &str,
    service: &str,
) -> Result<(usize, usize), kube::Error> {
    let Some(endpoints) = Api::<Endpoints>::namespaced(client.clone(), namespace)
        .get_opt(service)
        .await?
    else {
        return Ok((0, 0));
    };
    let subsets = endpoints.subsets.unwrap_or_default();
    let ready = subsets
        .iter()
        .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
        .sum();
    let not_ready = subsets
        .iter()
        .map(|s| s.not_ready_addresses.as_ref().map_or(0, Vec::len))
        .sum();
    Ok((ready, not_ready))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn rfc3339(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .map_or_else(|_| format!("{unix} (Unix seconds)"), |t| t.to_string())
}
