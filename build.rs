//! Stamps the binary with what `--version` and `myapp_build_info` report: the git commit it was
//! built from and the compiler that built it.
//!
//! The commit comes from `MYAPP_GIT_COMMIT` when set (an image build, whose context has no
//! `.git`, passes it as a build argument), else from `git` in the source tree, else it is
//! `unknown` (a source tarball without `.git`).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MYAPP_GIT_COMMIT");
    let commit = std::env::var("MYAPP_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=MYAPP_GIT_COMMIT={}", commit.trim());

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc_version = output(Command::new(rustc).arg("--version"))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=MYAPP_RUSTC_VERSION={rustc_version}");
}

/// HEAD's commit, and the files whose change means a new one: HEAD itself (a checkout), the
/// branch it points to (a commit) and packed-refs (a `git gc`). Without these lines cargo would
/// rerun this script on any change in the package instead, and miss a commit that changes no
/// file it tracks.
fn git_commit() -> Option<String> {
    let commit = output(Command::new("git").args(["rev-parse", "HEAD"]))?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = output(Command::new("git").args(["symbolic-ref", "-q", "HEAD"])) {
        watched.push(branch);
    }
    for file in watched {
        // A missing file would make cargo rerun this script on every build.
        let path = output(Command::new("git").args(["rev-parse", "--git-path", &file]));
        if let Some(path) = path.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}
