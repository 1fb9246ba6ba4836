//! The binary's own words: `--version`, and how a failure reads.

use std::process::Command;

fn operator(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_myapp-operator"))
        .args(args)
        .output()
        .expect("run myapp-operator")
}

#[test]
fn version_names_the_release_the_git_commit_and_the_compiler() {
    let out = operator(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim(),
        format!(
            "myapp-operator {} (commit {}, rustc {})",
            env!("CARGO_PKG_VERSION"),
            myapp_operator::version::GIT_COMMIT,
            myapp_operator::version::RUSTC
        )
    );
    // From a git checkout the commit is known; from a tarball (no .git) it is `unknown`.
    let commit = myapp_operator::version::GIT_COMMIT;
    let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".git")
        .exists();
    if std::env::var_os("MYAPP_GIT_COMMIT").is_none() {
        if checkout {
            assert!(
                commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
                "{commit}"
            );
        } else {
            assert_eq!(commit, "unknown");
        }
    }
    // Subcommands report the same (after their own name).
    let sub = String::from_utf8(operator(&["crd", "--version"]).stdout).unwrap();
    assert_eq!(
        sub.split_once(' ').unwrap().1,
        text.split_once(' ').unwrap().1
    );
}

#[test]
fn a_failure_prints_each_cause_once() {
    let out = operator(&["run", "--log-level", "myapp_operator=[[["]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("Error: invalid --log-level"), "{stderr}");
    // The parse error's text is quoted in the top message; anyhow would repeat it below.
    assert!(!stderr.contains("Caused by"), "{stderr}");
}
