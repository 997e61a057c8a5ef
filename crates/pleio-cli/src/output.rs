//! Shared output helpers: byte sizes, progress bars, atomic file writes.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// `1.50 GiB`-style size.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A byte-count progress bar on stderr (hidden when stderr is not a terminal).
pub fn byte_progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// A step-count progress bar on stderr (`what` is the initial message;
/// callers update it as phases change).
pub fn step_progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len}, eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// An output file written under a temporary name and renamed into place by
/// [`AtomicOutput::commit`]; dropped uncommitted (an error, a panic), the
/// temporary file is removed, so a failed command leaves no partial output.
pub struct AtomicOutput {
    tmp: PathBuf,
    dest: PathBuf,
    done: bool,
}

impl AtomicOutput {
    /// Creates `dest.partial` next to `dest` and returns it open for writing;
    /// refuses an existing `dest` unless `force`.
    pub fn create(dest: &Path, force: bool) -> Result<(AtomicOutput, File)> {
        if dest.exists() && !force {
            bail!("{} exists; pass --force to overwrite it", dest.display());
        }
        let mut name = dest
            .file_name()
            .context("output path has no file name")?
            .to_os_string();
        name.push(".partial");
        let tmp = dest.with_file_name(name);
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let out = AtomicOutput {
            tmp,
            dest: dest.to_path_buf(),
            done: false,
        };
        Ok((out, file))
    }

    /// Renames the finished temporary file into place. The caller has
    /// flushed (and, where it matters, synced) the file.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.tmp, &self.dest)
            .with_context(|| format!("renaming {} into place", self.tmp.display()))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for AtomicOutput {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `dest` atomically (used for small outputs).
pub fn write_atomic(
    dest: &Path,
    force: bool,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    let (out, file) = AtomicOutput::create(dest, force)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write(&mut w).with_context(|| format!("writing {}", dest.display()))?;
    w.into_inner().map_err(|e| e.into_error())?;
    out.commit()
}
