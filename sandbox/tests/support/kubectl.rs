//! Running the real kubectl against a served sandbox, with its own HOME and cache dir.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A kubectl environment: temp HOME, kubeconfig, cache dir.
pub struct Kubectl {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// A kubectl environment for `kubeconfig`, or None (test skipped) when kubectl is missing.
    pub fn new(kubeconfig: &str) -> Option<Kubectl> {
        let found = Command::new("kubectl")
            .arg("version")
            .arg("--client")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            if std::env::var("SANDBOX_REQUIRE_KUBECTL").as_deref() == Ok("1") {
                panic!("kubectl is not on PATH and SANDBOX_REQUIRE_KUBECTL=1");
            }
            eprintln!(
                "skipping: kubectl is not on PATH (set SANDBOX_REQUIRE_KUBECTL=1 to fail instead)"
            );
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig).expect("write kubeconfig");
        Some(Kubectl {
            dir,
            kubeconfig: path,
        })
    }

    pub fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("write manifest");
        path
    }

    pub async fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .arg("--request-timeout=20s")
            .args(args);
        tokio::task::spawn_blocking(move || cmd.output().expect("run kubectl"))
            .await
            .expect("join kubectl")
    }

    /// Runs kubectl and returns stdout, failing the test (with stderr) on a non-zero exit.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed\nstdout: {stdout}\nstderr: {stderr}"
        );
        stdout
    }
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}
