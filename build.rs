//! Stamps the binary with what `--version` and `myapp_build_info` report: the git commit it was
//! built from and the compiler that built it.
//!
//! The commit comes from `MYAPP_GIT_COMMIT` when set (an image build, whose context has no
//! `.git`, passes it as a build argument), else from `git` in the source tree, else it is
//! `unknown` (a source tarball without `.git`).
//!
//! It also packs the binary's relative relocations where the C library it links can read them
//! ([`pack_relative_relocations`]).

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

    pack_relative_relocations();
}

/// Links the binaries with `-z pack-relative-relocs` (DT_RELR) when they are built natively
/// for glibc 2.36 or newer, and tells the tests so (`cfg(packed_relocations)`).
///
/// A position-independent binary carries one 24-byte relocation for each pointer in its
/// read-only data (vtables, string tables): about 400 KB here. The dynamic loader reads all of
/// it at start, so every page of it stays mapped in every process. Packed, it is a few KB.
///
/// glibc reads the packed form from 2.36 on, and the linker marks the binary as needing it
/// (`GLIBC_ABI_DT_RELR`), so an older glibc refuses to start it with that name instead of
/// crashing. Hence only a native build on a glibc that has it: the binary runs where it was
/// built. A cross build, another C library, or a glibc whose version `getconf` does not report
/// links as before. The image (static musl, linked by zig) is one of those.
fn pack_relative_relocations() {
    println!("cargo:rustc-check-cfg=cfg(packed_relocations)");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let native_glibc = var("TARGET") == var("HOST")
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu";
    if !native_glibc {
        return;
    }
    // "glibc 2.36"
    let version = output(Command::new("getconf").arg("GNU_LIBC_VERSION"));
    let reads_relr = version
        .as_deref()
        .and_then(|v| v.strip_prefix("glibc "))
        .and_then(|v| {
            let mut parts = v.split('.').map(|n| n.parse::<u32>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .is_some_and(|version| version >= (2, 36));
    if reads_relr {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        println!("cargo:rustc-cfg=packed_relocations");
    }
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
