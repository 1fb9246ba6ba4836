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

/// build.rs links with `-z pack-relative-relocs` on a native glibc build that can read it: the
/// relative relocations (about 400 KB unpacked, all read at start and kept mapped) are a
/// `SHT_RELR` section of a few KB, and what is left as `SHT_RELA` is small.
#[cfg(packed_relocations)]
#[test]
fn the_binary_packs_its_relative_relocations() {
    const SHT_RELA: u32 = 4;
    const SHT_RELR: u32 = 19;
    let elf = std::fs::read(env!("CARGO_BIN_EXE_myapp-operator")).unwrap();
    assert_eq!(&elf[..5], b"\x7fELF\x02", "a 64-bit ELF file");
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (table, entry, count) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let sections: Vec<(u32, usize)> = (0..count)
        .map(|i| table + i * entry)
        .map(|header| (u32_at(header + 4), u64_at(header + 0x20)))
        .collect();
    let bytes_of = |kind| -> usize {
        sections
            .iter()
            .filter(|(t, _)| *t == kind)
            .map(|(_, size)| size)
            .sum()
    };
    assert!(
        bytes_of(SHT_RELR) > 0,
        "no SHT_RELR section; {} bytes of SHT_RELA relocations",
        bytes_of(SHT_RELA)
    );
    assert!(
        bytes_of(SHT_RELA) < 64 * 1024,
        "{} bytes of SHT_RELA relocations left",
        bytes_of(SHT_RELA)
    );
}
