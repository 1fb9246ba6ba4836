//! The install manifests in `deploy/` and the Dockerfile, checked without a cluster.

use std::{collections::BTreeSet, path::Path};

use k8s_openapi::{
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        apps::v1::Deployment,
        core::v1::{Container, Namespace, PodSpec, Service, ServiceAccount},
        networking::v1::NetworkPolicy,
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

fn deploy(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file)
}

use crate::support::install::deploy_documents as documents;

fn all_documents() -> Vec<(String, Value)> {
    kustomization_resources()
        .into_iter()
        .flat_map(|file| documents(&file).into_iter().map(move |d| (file.clone(), d)))
        .collect()
}

/// The files `deploy/kustomization.yaml` installs, relative to `deploy/`: its own and those of
/// the directories it includes (`base`).
fn kustomization_resources() -> Vec<String> {
    listed("").into_iter().flat_map(expand).collect()
}

fn expand(resource: String) -> Vec<String> {
    if deploy(&resource).is_dir() {
        let dir = format!("{resource}/");
        listed(&dir)
            .into_iter()
            .flat_map(|r| expand(format!("{dir}{r}")))
            .collect()
    } else {
        vec![resource]
    }
}

/// The `resources` of `deploy/<dir>kustomization.yaml`, as written.
fn listed(dir: &str) -> Vec<String> {
    let k = &documents(&format!("{dir}kustomization.yaml"))[0];
    k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect()
}

fn typed<T: DeserializeOwned>(doc: &Value) -> T {
    serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", doc["kind"], doc["metadata"]["name"]))
}

fn one<T: DeserializeOwned>(kind: &str, name: &str) -> T {
    let doc = all_documents()
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/"));
    typed(&doc)
}

fn operator_pod() -> PodSpec {
    one::<Deployment>("Deployment", "myapp-operator")
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
}

fn operator_container() -> Container {
    operator_pod()
        .containers
        .into_iter()
        .find(|c| c.name == "operator")
        .expect("container operator")
}

fn env(container: &Container, name: &str) -> Option<String> {
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[test]
fn kustomization_lists_every_manifest_file() {
    let listed: BTreeSet<String> = kustomization_resources().into_iter().collect();
    let yaml_files = |dir: &str| -> Vec<String> {
        std::fs::read_dir(deploy(dir))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| format!("{dir}{}", e.file_name().to_string_lossy()))
            .filter(|n| n.ends_with(".yaml") && !n.ends_with("kustomization.yaml"))
            .collect()
    };
    // install.yaml is the rendering of all the others (see tests/it/install.rs).
    let on_disk: BTreeSet<String> = yaml_files("")
        .into_iter()
        .chain(yaml_files("base/"))
        .filter(|n| n != "install.yaml")
        .collect();
    assert_eq!(listed, on_disk);
}

#[test]
fn every_document_parses_into_its_type() {
    for (file, doc) in all_documents() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "Namespace" => drop(typed::<Namespace>(&doc)),
            "CustomResourceDefinition" => drop(typed::<CustomResourceDefinition>(&doc)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(&doc)),
            "ClusterRole" => drop(typed::<ClusterRole>(&doc)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(&doc)),
            "Role" => drop(typed::<Role>(&doc)),
            "RoleBinding" => drop(typed::<RoleBinding>(&doc)),
            "Deployment" => drop(typed::<Deployment>(&doc)),
            "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(&doc)),
            "Service" => drop(typed::<Service>(&doc)),
            "NetworkPolicy" => drop(typed::<NetworkPolicy>(&doc)),
            "MutatingWebhookConfiguration" => drop(typed::<MutatingWebhookConfiguration>(&doc)),
            "ValidatingWebhookConfiguration" => drop(typed::<ValidatingWebhookConfiguration>(&doc)),
            // cert-manager kinds have no k8s-openapi type: check the fields we rely on.
            "Issuer" => assert_eq!(doc["apiVersion"], "cert-manager.io/v1", "{file}"),
            "Certificate" => {
                assert_eq!(doc["apiVersion"], "cert-manager.io/v1", "{file}");
                assert!(
                    doc["spec"]["secretName"].is_string()
                        && doc["spec"]["issuerRef"]["name"].is_string()
                );
            }
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
}

#[test]
fn namespace_enforces_pod_security_restricted() {
    let ns: Namespace = one("Namespace", "myapp-system");
    let labels = ns.metadata.labels.unwrap();
    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "restricted");
}

#[test]
fn the_pod_meets_pod_security_restricted_and_more() {
    let pod = operator_pod();
    let psc = pod.security_context.clone().unwrap_or_default();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert!(
        psc.run_as_user.is_some_and(|u| u > 0),
        "numeric non-root UID"
    );
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none());
    for volume in pod.volumes.iter().flatten() {
        assert!(
            volume.host_path.is_none(),
            "restricted forbids hostPath ({})",
            volume.name
        );
    }
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        let sc = c.security_context.clone().unwrap_or_default();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_ne!(sc.privileged, Some(true), "{}", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        let caps = sc.capabilities.unwrap_or_default();
        assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]), "{}", c.name);
        assert!(caps.add.unwrap_or_default().is_empty(), "{}", c.name);
        assert!(sc.run_as_user.is_none_or(|u| u > 0), "{}", c.name);
        for port in c.ports.iter().flatten() {
            assert!(port.host_port.is_none(), "{}", c.name);
        }
        let resources = c.resources.clone().unwrap_or_default();
        assert!(
            resources
                .requests
                .is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")),
            "{}",
            c.name
        );
        assert!(
            resources.limits.is_some_and(|r| r.contains_key("memory")),
            "{}",
            c.name
        );
    }
}

#[test]
fn the_certificate_secret_is_mounted_as_a_directory_where_the_flag_points() {
    let pod = operator_pod();
    let container = operator_container();
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "tls")
        .expect("tls mount");
    assert!(
        mount.sub_path.is_none() && mount.sub_path_expr.is_none(),
        "subPath mounts never see renewals"
    );
    assert_eq!(
        env(&container, "MYAPP_CERT_DIR").as_deref(),
        Some(mount.mount_path.as_str())
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "tls")
        .unwrap();
    // The files are root-owned: a non-root UID reads them through the fsGroup.
    let mode = volume
        .secret
        .as_ref()
        .unwrap()
        .default_mode
        .unwrap_or(0o644);
    let fs_group = pod.security_context.as_ref().and_then(|s| s.fs_group);
    assert!(
        mode & 0o004 != 0 || (mode & 0o040 != 0 && fs_group.is_some()),
        "the operator can read its key"
    );
    let certificate = all_documents()
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == "Certificate" && d["metadata"]["name"] == "myapp-operator-webhook")
        .unwrap();
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        certificate["spec"]["secretName"].as_str()
    );
}

#[test]
fn probes_and_services_point_at_the_ports_the_flags_open() {
    let container = operator_container();
    let port_of = |name: &str| {
        container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
            .unwrap()
    };
    let addr_port = |var: &str| {
        env(&container, var)
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<i32>()
            .unwrap()
    };
    assert_eq!(addr_port("MYAPP_WEBHOOK_ADDR"), port_of("webhook"));
    assert_eq!(addr_port("MYAPP_ADMIN_ADDR"), port_of("admin"));
    for (probe, path) in [
        (container.liveness_probe.clone(), "/livez"),
        (container.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe.unwrap().http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("admin".into())
        );
    }
    let webhook: Service = one("Service", "myapp-operator-webhook");
    let port = &webhook.spec.unwrap().ports.unwrap()[0];
    assert_eq!(port.port, 443);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("webhook".into()))
    );
}

#[test]
fn termination_grace_outlasts_the_drain_delay_and_a_request() {
    let pod = operator_pod();
    let drain = myapp_operator::cli::parse_duration(
        &env(&operator_container(), "MYAPP_DRAIN_DELAY").unwrap(),
    )
    .unwrap();
    let longest_webhook_timeout = 5;
    assert!(
        pod.termination_grace_period_seconds.unwrap()
            > drain.as_secs() as i64 + longest_webhook_timeout
    );
}

#[test]
fn deployment_is_highly_available() {
    let d: Deployment = one("Deployment", "myapp-operator");
    let spec = d.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert!(
        !spec
            .template
            .spec
            .unwrap()
            .topology_spread_constraints
            .unwrap_or_default()
            .is_empty()
    );
    let pdb: PodDisruptionBudget = one("PodDisruptionBudget", "myapp-operator");
    assert_eq!(
        pdb.spec.unwrap().min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
}

#[test]
fn rbac_has_no_wildcards_no_secrets_and_no_delete() {
    // The operator's roles; user-roles.yaml is for people, who may delete their MyApps.
    let roles: Vec<Value> = all_documents()
        .into_iter()
        .filter(|(file, _)| file != "base/user-roles.yaml")
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .collect();
    assert!(!roles.is_empty());
    for role in roles {
        for rule in role["rules"].as_array().unwrap() {
            for field in ["apiGroups", "resources", "verbs"] {
                for v in rule[field].as_array().unwrap() {
                    assert_ne!(v, "*", "wildcard in {}", role["metadata"]["name"]);
                }
            }
            assert!(
                !rule["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r == "secrets")
            );
            assert!(
                !rule["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v == "delete" || v == "deletecollection")
            );
        }
    }
    let lease_role: Role = one("Role", "myapp-operator-leader-election");
    assert_eq!(
        lease_role.metadata.namespace.as_deref(),
        Some("myapp-system")
    );
}

#[test]
fn webhook_configurations_are_scoped_and_fail_as_intended() {
    let mutating: MutatingWebhookConfiguration =
        one("MutatingWebhookConfiguration", "myapp-operator");
    let validating: ValidatingWebhookConfiguration =
        one("ValidatingWebhookConfiguration", "myapp-operator");
    // The CA comes from the install (tests/it/install.rs renders both ways), never from here.
    for hook in mutating.webhooks.iter().flatten() {
        assert!(hook.client_config.ca_bundle.is_none(), "{}", hook.name);
    }
    for hook in validating.webhooks.iter().flatten() {
        assert!(hook.client_config.ca_bundle.is_none(), "{}", hook.name);
    }
    let m = &mutating.webhooks.unwrap()[0];
    let validating = validating.webhooks.unwrap();
    let v = &validating[0];
    assert_eq!(v.failure_policy.as_deref(), Some("Fail"));
    // `kubectl scale` and autoscalers write replicas through the scale subresource: its own
    // webhook, on its own path (the review carries a Scale, not a MyApp).
    let scale = &validating[1];
    let rules = scale.rules.as_ref().unwrap();
    assert_eq!(rules[0].resources, Some(vec!["myapps/scale".to_owned()]));
    assert_eq!(rules[0].operations, Some(vec!["UPDATE".to_owned()]));
    assert_eq!(scale.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(
        scale
            .client_config
            .service
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some(myapp_operator::admission::SCALE_PATH)
    );
    assert_eq!(scale.timeout_seconds, v.timeout_seconds);
    assert_eq!(scale.namespace_selector, v.namespace_selector);
    for (rules, side_effects, versions, match_policy, timeout, selector, conditions, service) in [
        (
            &m.rules,
            &m.side_effects,
            &m.admission_review_versions,
            &m.match_policy,
            m.timeout_seconds,
            &m.namespace_selector,
            &m.match_conditions,
            &m.client_config.service,
        ),
        (
            &v.rules,
            &v.side_effects,
            &v.admission_review_versions,
            &v.match_policy,
            v.timeout_seconds,
            &v.namespace_selector,
            &v.match_conditions,
            &v.client_config.service,
        ),
    ] {
        let rules = rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resources,
            Some(vec!["myapps".to_owned()]),
            "not myapps/status"
        );
        assert_eq!(
            rules[0].operations,
            Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()])
        );
        assert_eq!(side_effects, "None");
        assert_eq!(versions, &vec!["v1".to_owned()]);
        assert_eq!(match_policy.as_deref(), Some("Equivalent"));
        assert!(timeout.is_some_and(|t| t <= 10));
        let excluded = &selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap()[0];
        assert_eq!(excluded.operator, "NotIn");
        assert!(
            excluded
                .values
                .as_ref()
                .unwrap()
                .contains(&"kube-system".to_owned())
        );
        assert!(
            excluded
                .values
                .as_ref()
                .unwrap()
                .contains(&"myapp-system".to_owned())
        );
        assert!(
            conditions.as_ref().unwrap()[0]
                .expression
                .contains("object.spec != oldObject.spec")
        );
        let service = service.as_ref().unwrap();
        assert_eq!(
            (
                service.name.as_str(),
                service.namespace.as_str(),
                service.port
            ),
            ("myapp-operator-webhook", "myapp-system", Some(443))
        );
    }
}

#[test]
fn the_network_policies_open_the_webhook_port_to_all_and_the_admin_port_to_monitoring_only() {
    let port_of = |rule: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| {
        let ports = rule.ports.clone().unwrap_or_default();
        assert_eq!(ports.len(), 1, "one port per rule: {rule:?}");
        match ports[0].port.clone() {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name)) => name,
            other => panic!("ports are named as in the Deployment: {other:?}"),
        }
    };
    // The install: the API server calls from wherever it runs; nothing else gets in.
    let policy: NetworkPolicy = one("NetworkPolicy", "myapp-operator");
    let rules = policy.spec.unwrap().ingress.unwrap();
    assert_eq!(rules.len(), 1, "no other way in: {rules:?}");
    assert_eq!(port_of(&rules[0]), "webhook");
    assert!(rules[0].from.is_none());

    // deploy/monitoring adds the admin port, from labelled namespaces only.
    let monitoring: NetworkPolicy = typed(&documents("monitoring/networkpolicy.yaml")[0]);
    let rules = monitoring.spec.unwrap().ingress.unwrap();
    assert_eq!(rules.len(), 1, "no other way in: {rules:?}");
    assert_eq!(port_of(&rules[0]), "admin");
    let peers = rules[0].from.clone().unwrap();
    assert_eq!(peers.len(), 1);
    assert!(peers[0].pod_selector.is_none() && peers[0].ip_block.is_none());
    let labels = peers[0]
        .namespace_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap();
    assert_eq!(
        labels,
        [("myapp.example.com/monitoring".to_owned(), "true".to_owned())].into()
    );
    // The label an admin must set is documented where the install is.
    let readme = std::fs::read_to_string(deploy("README.md")).unwrap();
    assert!(readme.contains("myapp.example.com/monitoring"));
}

#[test]
fn the_webhook_gives_up_on_a_request_no_later_than_the_api_server_does() {
    // Work past the API server's timeoutSeconds answers nobody and only burns CPU.
    let config = webhook::ServerConfig::new(([127, 0, 0, 1], 0).into(), "/tls");
    let mutating: MutatingWebhookConfiguration =
        one("MutatingWebhookConfiguration", "myapp-operator");
    let validating: ValidatingWebhookConfiguration =
        one("ValidatingWebhookConfiguration", "myapp-operator");
    let timeouts = (mutating.webhooks.unwrap().iter())
        .map(|w| w.timeout_seconds)
        .chain(
            validating
                .webhooks
                .unwrap()
                .iter()
                .map(|w| w.timeout_seconds),
        )
        .collect::<Vec<_>>();
    assert!(!timeouts.is_empty());
    for timeout in timeouts {
        // Unset means 10 s on the API server.
        let timeout = std::time::Duration::from_secs(timeout.unwrap_or(10).try_into().unwrap());
        assert!(config.request_timeout <= timeout, "{timeout:?}");
        assert!(config.body_read_timeout <= config.request_timeout);
    }
}

#[test]
fn dockerfile_builds_locked_and_runs_a_static_non_root_binary() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(
        froms.len(),
        2,
        "a build stage and a runtime stage: {froms:?}"
    );
    assert!(froms[0].contains(" AS build"));
    // The build runs on the builder's platform and cross-compiles; the runtime stage is the
    // target's.
    assert!(
        froms[0].starts_with("FROM --platform=$BUILDPLATFORM "),
        "{}",
        froms[0]
    );
    assert!(!froms[1].contains("--platform"), "{}", froms[1]);
    assert!(
        froms[1].contains("distroless/static"),
        "runtime has no shell: {}",
        froms[1]
    );
    assert!(text.contains("cargo zigbuild --release --locked"));
    // The image says which version it is, and that is the crate's.
    assert!(
        text.contains(&format!(
            "ARG MYAPP_VERSION={}\n",
            env!("CARGO_PKG_VERSION")
        )),
        "the Dockerfile's MYAPP_VERSION default is the crate's version"
    );
    let user = text
        .lines()
        .rfind(|l| l.starts_with("USER "))
        .expect("a USER line");
    let uid: u32 = user[5..]
        .split(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .expect("numeric UID");
    assert!(uid > 0);
    assert!(text.contains("ENTRYPOINT [\"/myapp-operator\"]"));
    let runtime = text.split(froms[1]).nth(1).unwrap();
    let copies: Vec<&str> = runtime.lines().filter(|l| l.starts_with("COPY")).collect();
    assert_eq!(
        copies,
        ["COPY --from=build /myapp-operator /myapp-operator"],
        "only the binary"
    );
    let exposes = runtime.lines().filter(|l| l.starts_with("EXPOSE")).count();
    assert_eq!(exposes, 2);
    let docker_ignore =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".dockerignore"))
            .unwrap();
    assert!(docker_ignore.lines().any(|l| l.trim() == "target/"));
}

/// The Dockerfile's build stage replayed without a container engine: each `COPY` brings files
/// from the build context (less `.dockerignore`) into a temporary root, each shell step runs
/// there, and each `cargo` step is checked with `cargo fetch --locked --offline` for its
/// target, which parses every manifest and target path the way the build would (`cargo
/// metadata` and `cargo tree` accept a manifest whose bench files are missing; this does not).
/// Toolchain steps (`rustup`, `apt-get`, `pip3`) are the base image's business and are skipped.
/// The stage is replayed once per architecture the image is built for, as BuildKit runs it with
/// `TARGETARCH` set; an architecture without a Rust target stops the build with its reason.
#[test]
fn dockerfile_build_stage_steps_each_have_the_files_they_need() {
    for arch in ["amd64", "arm64"] {
        replay_build_stage(arch).unwrap_or_else(|e| panic!("TARGETARCH={arch}: {e}"));
    }
    let refused = replay_build_stage("riscv64").unwrap_err();
    assert!(
        refused.contains("no Rust target for TARGETARCH=riscv64"),
        "{refused}"
    );
}

/// Replays the build stage for `arch`; the error is the step that failed, with its output.
fn replay_build_stage(arch: &str) -> Result<(), String> {
    let context = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(context.join("Dockerfile")).unwrap();
    let ignored = docker_ignore(context);
    let root = tempfile::tempdir().unwrap();
    let mut workdir = root.path().to_path_buf();
    let mut cargo_steps = 0;
    let mut built_binary = None;
    for (line, instruction) in dockerfile_instructions(&text) {
        let (verb, rest) = instruction.split_once(' ').unwrap_or((&instruction, ""));
        match verb {
            // The runtime stage starts: what it copies from the build stage is checked below.
            "FROM" if rest.contains("distroless") => break,
            "WORKDIR" => {
                workdir = root.path().join(rest.trim_start_matches('/'));
                std::fs::create_dir_all(&workdir).unwrap();
            }
            "COPY" => {
                let parts: Vec<&str> = rest.split_whitespace().collect();
                let (sources, dest) = parts.split_at(parts.len() - 1);
                for source in sources {
                    // A directory's contents go into the destination; a file goes to the
                    // destination, or into it when it ends with `/`.
                    let from = context.join(source);
                    let mut target = workdir.join(dest[0]);
                    if from.is_file() && dest[0].ends_with('/') {
                        target = target.join(from.file_name().unwrap());
                    }
                    copy_context(context, &from, &target, &ignored)
                        .unwrap_or_else(|e| panic!("Dockerfile:{line}: COPY {source}: {e}"));
                }
            }
            "RUN" => {
                for step in rest.split("&&").map(str::trim) {
                    let program = step.split_whitespace().next().unwrap_or("");
                    match program {
                        "rustup" | "apt-get" | "pip3" => {}
                        "rm" if step.contains("/var/lib/apt") => {}
                        "cargo" => {
                            cargo_steps += 1;
                            assert!(step.contains("--locked"), "Dockerfile:{line}: {step}");
                            assert!(
                                step.contains("--no-default-features"),
                                "Dockerfile:{line}: the image leaves `dev` and the sandbox out"
                            );
                            let mut fetch = std::process::Command::new(env!("CARGO"));
                            fetch
                                .args(["fetch", "--locked", "--offline", "--quiet"])
                                .current_dir(&workdir);
                            let words = shell_words(step, &workdir, arch);
                            if let Some(at) = words.iter().position(|w| w == "--target") {
                                fetch.args(["--target", &words[at + 1]]);
                            }
                            let output = fetch.output().unwrap();
                            assert!(
                                output.status.success(),
                                "Dockerfile:{line}: `{step}` fails in the layout the stage \
                                 has built so far:\n{}",
                                String::from_utf8_lossy(&output.stderr)
                            );
                        }
                        "cp" if step.contains("target/") => {
                            let words = shell_words(step, &workdir, arch);
                            built_binary = Some((words[1].clone(), words[2].clone()));
                        }
                        _ => {
                            let output = std::process::Command::new("sh")
                                .args(["-c", step])
                                .env("TARGETARCH", arch)
                                .current_dir(&workdir)
                                .output()
                                .unwrap();
                            if !output.status.success() {
                                return Err(format!(
                                    "Dockerfile:{line}: {step}: {}",
                                    String::from_utf8_lossy(&output.stderr)
                                ));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    assert!(cargo_steps >= 2, "a dependency build and the real build");
    let (built, copied_to) = built_binary.expect("the build stage copies the built binary out");
    let target = std::fs::read_to_string(workdir.join("rust-target")).unwrap();
    assert_eq!(
        Path::new(&built),
        Path::new("target")
            .join(target.trim())
            .join("release")
            .join(
                Path::new(env!("CARGO_BIN_EXE_myapp-operator"))
                    .file_name()
                    .unwrap()
            ),
        "the build stage copies the binary cargo builds for the target"
    );
    assert!(
        text.contains(&format!("COPY --from=build {copied_to} ")),
        "the runtime stage copies {copied_to}"
    );
    Ok(())
}

/// A step's words after the shell's expansion (`$(cat rust-target)`, quotes), in `dir` with
/// `TARGETARCH` set as BuildKit sets it.
fn shell_words(step: &str, dir: &Path, arch: &str) -> Vec<String> {
    let output = std::process::Command::new("sh")
        .args(["-c", &format!("printf '%s\\n' {step}")])
        .env("TARGETARCH", arch)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{step}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The Dockerfile's instructions with their first line number, continuation lines joined.
fn dockerfile_instructions(text: &str) -> Vec<(usize, String)> {
    let mut instructions = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if current.is_none() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        let (start, mut joined) = current.take().unwrap_or((index + 1, String::new()));
        let (body, continued) = match trimmed.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (trimmed, false),
        };
        joined.push_str(body.trim());
        joined.push(' ');
        if continued {
            current = Some((start, joined));
        } else {
            instructions.push((start, joined.trim().to_owned()));
        }
    }
    instructions
}

/// `.dockerignore`'s patterns, each either a top-level path (`target/`) or `**/*.ext`.
fn docker_ignore(context: &Path) -> Vec<String> {
    std::fs::read_to_string(context.join(".dockerignore"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/').to_owned())
        .collect()
}

fn is_ignored(relative: &Path, patterns: &[String]) -> bool {
    let path = relative.to_string_lossy();
    patterns
        .iter()
        .any(|pattern| match pattern.strip_prefix("**/*") {
            Some(suffix) => path.ends_with(suffix),
            None => path == pattern.as_str(),
        })
}

/// Copies `source` (a file or directory of the build context) to `target`, as `COPY` does.
fn copy_context(
    context: &Path,
    source: &Path,
    target: &Path,
    ignored: &[String],
) -> std::io::Result<()> {
    let relative = source.strip_prefix(context).unwrap();
    if !relative.as_os_str().is_empty() && is_ignored(relative, ignored) {
        return Ok(());
    }
    if source.is_dir() {
        std::fs::create_dir_all(target)?;
        for entry in std::fs::read_dir(source)? {
            let entry = entry?;
            copy_context(
                context,
                &entry.path(),
                &target.join(entry.file_name()),
                ignored,
            )?;
        }
        Ok(())
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(source, target).map(drop)
    }
}
