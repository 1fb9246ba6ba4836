//! The real kubectl against a sandbox served on loopback.

use std::process::Output;

use kube::CustomResourceExt;
use kube_sandbox::testing::{Kubectl, path_str};
use kube_sandbox::{Sandbox, Served};

use super::fixtures::Widget;

/// Serves `sandbox` over plain HTTP on a free port, with a kubectl for it; None when kubectl is
/// missing, and the test returns early. Keep the `Served`: dropping it stops the server.
pub async fn served_kubectl(sandbox: &Sandbox) -> Option<(Served, Kubectl)> {
    let served = sandbox.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let kubectl = Kubectl::new(&served.kubeconfig())?;
    Some((served, kubectl))
}

/// What kubectl printed on stdout.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What kubectl printed on stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Applies the Widget CRD with `kubectl apply <flags> -f`, returning what kubectl printed.
pub async fn apply_widget_crd(k: &Kubectl, flags: &[&str]) -> String {
    let crd = k.file(
        "crd.json",
        &serde_json::to_string_pretty(&Widget::crd()).unwrap(),
    );
    k.ok(&[&["apply"], flags, &["-f", path_str(&crd)]].concat())
        .await
}
