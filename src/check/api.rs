//! API: the server answers, is a supported version, and serves the CRD this binary was built
//! with.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use super::{
    report::{Check, Group},
    target::{api_message, names},
};
use crate::crd::{
    SCHEMA_DIGEST_ANNOTATION, SCHEMA_SERIAL, SCHEMA_SERIAL_ANNOTATION, schema_digest,
};

/// The oldest supported Kubernetes minor version (README "Supported Kubernetes versions").
pub const OLDEST_MINOR: u32 = 33;

/// The command that installs the CRD of this binary.
pub const APPLY_CRD: &str = "kubectl apply -f deploy/base/crd.yaml (of this release), or: myapp-operator crd | kubectl apply -f -";

/// The API group, whether the server answered, whether the CRD is installed.
pub async fn checks(client: &Client) -> (Group, bool, bool) {
    let mut checks = Vec::new();
    let version = match client.apiserver_version().await {
        Ok(version) => version,
        Err(error) => {
            checks.push(Check::fail(
                "api.reachable",
                format!(
                    "the Kubernetes API server at {} does not answer: {}",
                    crate::telemetry::api_server(),
                    crate::error::chain(&error)
                ),
                "check the kube-context (kubectl config current-context) or pass --kubeconfig",
                "api",
            ));
            return (group(checks), false, false);
        }
    };
    checks.push(Check::ok(
        "api.reachable",
        format!(
            "the Kubernetes API server answers ({})",
            version.git_version
        ),
    ));
    checks.push(version_check(&version.major, &version.minor));
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(names::CRD)
        .await;
    let installed = match crd {
        Ok(Some(crd)) => {
            checks.extend(crd_checks(&crd));
            true
        }
        Ok(None) => {
            checks.push(Check::fail(
                "api.crd",
                format!(
                    "the CustomResourceDefinition {} is not installed",
                    names::CRD
                ),
                APPLY_CRD,
                "api",
            ));
            false
        }
        Err(error) => {
            checks.push(Check::fail(
                "api.crd",
                format!(
                    "the CustomResourceDefinition {} cannot be read: {}",
                    names::CRD,
                    api_message(&error)
                ),
                "run check as a user who may get customresourcedefinitions",
                "api",
            ));
            false
        }
    };
    (group(checks), true, installed)
}

fn group(checks: Vec<Check>) -> Group {
    Group {
        name: "API",
        checks,
    }
}

fn version_check(major: &str, minor: &str) -> Check {
    // Managed clusters report minors such as "33+".
    let minor_number = minor.trim_end_matches('+').parse::<u32>().ok();
    match (major, minor_number) {
        ("1", Some(n)) if n >= OLDEST_MINOR => Check::ok(
            "api.version",
            format!("Kubernetes 1.{n} is supported (1.{OLDEST_MINOR} and newer)"),
        ),
        _ => Check::fail(
            "api.version",
            format!(
                "Kubernetes {major}.{minor} is not supported: the operator needs 1.{OLDEST_MINOR} or newer"
            ),
            format!("upgrade the cluster to Kubernetes 1.{OLDEST_MINOR} or newer"),
            "api",
        ),
    }
}

fn crd_checks(crd: &CustomResourceDefinition) -> Vec<Check> {
    let mut checks = vec![Check::ok(
        "api.crd",
        format!("the CustomResourceDefinition {} is installed", names::CRD),
    )];
    let established = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Established");
    let served = crd
        .spec
        .versions
        .iter()
        .any(|v| v.name == crate::crd::VERSION && v.served);
    match (served, established) {
        (true, Some(c)) if c.status != "True" => checks.push(Check::fail(
            "api.crd.serves-v1",
            format!(
                "{} is not established: {}",
                names::CRD,
                c.message.as_deref().unwrap_or("no reason given")
            ),
            format!("kubectl describe crd {}", names::CRD),
            "api",
        )),
        (true, _) => checks.push(Check::ok(
            "api.crd.serves-v1",
            format!("{} serves example.com/v1", names::CRD),
        )),
        (false, _) => checks.push(Check::fail(
            "api.crd.serves-v1",
            format!("{} does not serve example.com/v1", names::CRD),
            APPLY_CRD,
            "api",
        )),
    }
    checks.push(schema_check(crd));
    checks
}

/// Compares the stamp annotations of the installed CRD with this build's.
fn schema_check(crd: &CustomResourceDefinition) -> Check {
    const ID: &str = "api.crd.schema";
    let annotations = crd.metadata.annotations.clone().unwrap_or_default();
    let digest = schema_digest();
    let Some(serial) = annotations.get(SCHEMA_SERIAL_ANNOTATION) else {
        return Check::fail(
            ID,
            format!(
                "{} carries no {SCHEMA_SERIAL_ANNOTATION} annotation: it was not installed from this project's deploy/base/crd.yaml",
                names::CRD
            ),
            APPLY_CRD,
            "api",
        );
    };
    let installed_digest = annotations
        .get(SCHEMA_DIGEST_ANNOTATION)
        .map_or("none", String::as_str);
    match serial.parse::<u32>() {
        Ok(n) if n < SCHEMA_SERIAL => Check::fail(
            ID,
            format!(
                "the installed CRD schema is older than this binary's (serial {n}, this binary has {SCHEMA_SERIAL})"
            ),
            APPLY_CRD,
            "upgrade",
        ),
        Ok(n) if n > SCHEMA_SERIAL => Check::fail(
            ID,
            format!(
                "the installed CRD schema is newer than this binary's (serial {n}, this binary has {SCHEMA_SERIAL}): this operator is older than the CRD"
            ),
            "upgrade the operator to the release whose deploy/base/crd.yaml was applied (a downgrade of the CRD could drop fields newer MyApps use)",
            "upgrade",
        ),
        Ok(_) if installed_digest != digest => Check::fail(
            ID,
            format!(
                "the installed CRD schema has changed: serial {serial} as this binary's, but digest {installed_digest} where this binary was built with {digest}"
            ),
            APPLY_CRD,
            "upgrade",
        ),
        Ok(_) => Check::ok(
            ID,
            format!(
                "the CRD schema is the one this binary was built with (serial {serial}, {})",
                short(&digest)
            ),
        ),
        Err(_) => Check::fail(
            ID,
            format!("{SCHEMA_SERIAL_ANNOTATION} is {serial:?}, not a number"),
            APPLY_CRD,
            "upgrade",
        ),
    }
}

/// `sha256:0123456789ab`: enough of a digest for people to compare.
fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    #[test]
    fn versions_from_1_33_on_are_supported_including_managed_plus_minors() {
        assert_eq!(version_check("1", "33").status, Status::Ok);
        assert_eq!(version_check("1", "34+").status, Status::Ok);
        assert_eq!(version_check("1", "32").status, Status::Fail);
        assert_eq!(version_check("2", "0").status, Status::Fail);
    }

    #[test]
    fn the_schema_stamp_says_older_newer_or_changed() {
        let stamped = |serial: u32, digest: &str| {
            let mut crd = crate::crd::stamped_crd();
            let annotations = crd.metadata.annotations.as_mut().unwrap();
            annotations.insert(SCHEMA_SERIAL_ANNOTATION.into(), serial.to_string());
            annotations.insert(SCHEMA_DIGEST_ANNOTATION.into(), digest.into());
            schema_check(&crd)
        };
        let current = schema_check(&crate::crd::stamped_crd());
        assert_eq!(current.status, Status::Ok, "{}", current.message);
        let older = stamped(SCHEMA_SERIAL - 1, "sha256:0");
        assert!(older.message.contains("older"), "{}", older.message);
        let newer = stamped(SCHEMA_SERIAL + 1, "sha256:0");
        assert!(newer.message.contains("newer"), "{}", newer.message);
        let changed = stamped(SCHEMA_SERIAL, "sha256:0");
        assert!(changed.message.contains("changed"), "{}", changed.message);
        assert_eq!(older.hint.as_deref(), Some(APPLY_CRD));
    }
}
