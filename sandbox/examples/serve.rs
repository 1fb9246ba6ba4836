//! Serves a sandbox on loopback and writes a kubeconfig for it, for poking at it with kubectl.
//!
//! `cargo run -p kube-sandbox --example serve -- [kubeconfig-path] [server-minor]`

use kube_sandbox::Sandbox;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "sandbox.kubeconfig".into());
    let minor: u32 = args.next().and_then(|m| m.parse().ok()).unwrap_or(32);
    let sandbox = Sandbox::builder().server_minor_version(minor).build();
    let served = sandbox
        .serve("127.0.0.1:0".parse().expect("loopback address"))
        .await
        .expect("serve");
    std::fs::write(&path, served.kubeconfig()).expect("write kubeconfig");
    println!("serving on {}; kubeconfig in {path}", served.addr());
    tokio::signal::ctrl_c().await.expect("wait for ctrl-c");
}
