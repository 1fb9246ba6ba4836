//! cert-manager, when its Certificate kind is served: the webhook's Certificate is Ready and
//! both webhook configurations ask the CA injector for it.

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};

use super::{
    report::{Check, Group},
    target::{Target, api_message, is_not_found, names},
    webhook::Configurations,
};

/// The cert-manager group.
pub async fn checks(client: &Client, target: &Target, configurations: &Configurations) -> Group {
    let group = |checks| Group {
        name: "cert-manager",
        checks,
    };
    if target.is_dev() {
        return group(vec![Check::skip(
            "cert-manager.served",
            "dev makes its own CA and serving certificate: cert-manager has no part in it",
        )]);
    }
    let served = match client.list_api_group_resources("cert-manager.io/v1").await {
        Ok(list) => list.resources.iter().any(|r| r.name == "certificates"),
        Err(error) if is_not_found(&error) => false,
        Err(error) => {
            return group(vec![Check::fail(
                "cert-manager.served",
                format!(
                    "cannot ask whether cert-manager is installed: {}",
                    api_message(&error)
                ),
                "run check as a user who may read API discovery",
                "cert-manager",
            )]);
        }
    };
    if !served {
        return group(vec![Check::skip(
            "cert-manager.served",
            "cert-manager's Certificate kind is not served: skipped (the serving certificate is managed by hand, see deploy/README.md#without-cert-manager)",
        )]);
    }
    let mut checks = Vec::new();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"),
        "certificates",
    );
    let certificate = format!("{}/{}", target.namespace, names::CERTIFICATE);
    let describe = format!(
        "kubectl -n {} describe certificate {}; kubectl -n {} get certificaterequests",
        target.namespace,
        names::CERTIFICATE,
        target.namespace
    );
    match Api::<DynamicObject>::namespaced_with(client.clone(), &target.namespace, &resource)
        .get_opt(names::CERTIFICATE)
        .await
    {
        Ok(Some(object)) => {
            let ready = object.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready");
            match ready {
                Some(c) if c["status"] == "True" => checks.push(Check::ok(
                    "cert-manager.certificate",
                    format!("the Certificate {certificate} is Ready"),
                )),
                other => checks.push(Check::fail(
                    "cert-manager.certificate",
                    format!(
                        "the Certificate {certificate} is not Ready: {}",
                        other
                            .and_then(|c| c["message"].as_str())
                            .unwrap_or("cert-manager has not reported on it")
                    ),
                    describe,
                    "cert-manager",
                )),
            }
        }
        Ok(None) => checks.push(Check::fail(
            "cert-manager.certificate",
            format!("the Certificate {certificate} does not exist"),
            "kubectl apply -f deploy/certificates.yaml",
            "cert-manager",
        )),
        Err(error) => checks.push(Check::fail(
            "cert-manager.certificate",
            format!(
                "the Certificate {certificate} cannot be read: {}",
                api_message(&error)
            ),
            describe,
            "cert-manager",
        )),
    }
    for (id, annotation) in &configurations.inject_ca_from {
        let check_id = format!("cert-manager.inject-ca-from.{id}");
        match annotation {
            Some(value) if *value == certificate => checks.push(Check::ok(
                check_id,
                format!("the {id} webhook configuration takes its caBundle from {certificate}"),
            )),
            other => checks.push(Check::fail(
                check_id,
                format!(
                    "the {id} webhook configuration's cert-manager.io/inject-ca-from is {}, not {certificate}: its caBundle is not kept in step with the serving certificate",
                    other.as_deref().map_or("unset".to_owned(), |v| format!("{v:?}"))
                ),
                format!(
                    "kubectl annotate --overwrite {id}webhookconfiguration {} cert-manager.io/inject-ca-from={certificate}",
                    names::WEBHOOK_CONFIGURATION
                ),
                "cert-manager",
            )),
        }
    }
    group(checks)
}
