//! Shared terminal output helpers: byte sizes and progress bars.

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

/// Errors given the file they concern, in front, unless the message
/// already names it (engine errors do): each cause is printed once.
pub trait InFile<T> {
    /// `self`'s error with `path` in front if it does not name it yet.
    fn in_file(self, path: &std::path::Path) -> anyhow::Result<T>;
}

impl<T, E: Into<anyhow::Error>> InFile<T> for std::result::Result<T, E> {
    fn in_file(self, path: &std::path::Path) -> anyhow::Result<T> {
        self.map_err(|e| {
            let e: anyhow::Error = e.into();
            let shown = path.display().to_string();
            if format!("{e:#}").contains(&shown) {
                e
            } else {
                e.context(shown)
            }
        })
    }
}
