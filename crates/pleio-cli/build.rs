//! Bakes the git commit the binary was built from into `PLEIO_GIT_COMMIT`
//! (`-dirty` when a tracked file the binary is built from, under `crates/`,
//! `corpus/` or the workspace's manifests, differed from it; `unknown`
//! outside a git checkout), so every `--json` report names the code that
//! measured it.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // What the binary is built from (not docs/ or scripts/): cwd is crates/pleio-cli.
    let dirty = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "../../crates",
        "../../corpus",
        "../../Cargo.toml",
        "../../Cargo.lock",
    ])
    .is_some_and(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=PLEIO_GIT_COMMIT={commit}{}",
        if dirty { "-dirty" } else { "" }
    );
    // Rerun when HEAD moves (a commit rewrites the index) or a source changes.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/index");
    }
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=../pleio/src");
    println!("cargo:rerun-if-changed=../pleio-lab/src");
}
