//! What the lab asks of the OS that the engine never does: process
//! counters and peak RSS (`/proc/self`), the machine's description, the
//! texts that locate this process's memory cgroup, and free disk space
//! (`statvfs` through rustix's safe wrapper). Every reader answers `None`
//! (or empty) where the OS does not tell.
//!
//! The engine keeps what it calls itself (page size, advice, eviction,
//! residency, fault counters of one thread) in `pleio::sys`.

use std::path::Path;

/// A text file of `/proc`, if there is one.
fn proc_text(path: &str) -> Option<String> {
    if cfg!(target_os = "linux") {
        std::fs::read_to_string(path).ok()
    } else {
        None
    }
}

/// Bytes this process has caused to be read from storage so far (Linux
/// `read_bytes` of `/proc/self/io`: every thread, io_uring workers
/// included; page-cache hits do not count).
pub fn process_read_bytes() -> Option<u64> {
    proc_text("/proc/self/io")?
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Major page faults of the whole process so far (`majflt` of
/// `/proc/self/stat`).
pub fn process_major_faults() -> Option<u64> {
    // `majflt` is field 12 of /proc/self/stat, counted after the command
    // name (which may hold spaces and parentheses).
    let text = proc_text("/proc/self/stat")?;
    let after = &text[text.rfind(')')? + 1..];
    after.split_whitespace().nth(9)?.parse().ok()
}

/// Peak resident set size of this process in bytes (`VmHWM`).
pub fn peak_rss() -> Option<u64> {
    proc_text("/proc/self/status")?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .and_then(|kb| kb.checked_mul(1024))
}

/// Resets [`peak_rss`] to the current RSS (`/proc/self/clear_refs`);
/// false where the OS refuses.
pub fn reset_peak_rss() -> bool {
    cfg!(target_os = "linux") && std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This machine's CPU model, physical memory in bytes and kernel release
/// (empty / 0 where the OS does not tell).
pub fn machine() -> (String, u64, String) {
    let cpu = proc_text("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let mem = proc_text("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kb| kb.saturating_mul(1024));
    let kernel = proc_text("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    (cpu, mem, kernel)
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), to say in a
/// report how busy the machine was.
pub fn load_average() -> Option<[f64; 3]> {
    let text = proc_text("/proc/loadavg")?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The texts of `/proc/self/mountinfo` and `/proc/self/cgroup` (empty
/// where there are none), for locating this process's memory cgroup.
pub fn cgroup_texts() -> (String, String) {
    (
        proc_text("/proc/self/mountinfo").unwrap_or_default(),
        proc_text("/proc/self/cgroup").unwrap_or_default(),
    )
}

/// Free bytes available to this user on the file system holding `path`,
/// if the OS can tell.
#[cfg(unix)]
pub fn free_bytes(path: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(path).ok()?;
    st.f_bavail.checked_mul(st.f_frsize)
}

/// Free bytes available to this user on the file system holding `path`,
/// if the OS can tell.
#[cfg(not(unix))]
pub fn free_bytes(_path: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_answer_on_linux() {
        if !cfg!(target_os = "linux") {
            pleio_testkit::skip!("/proc readers are Linux-only");
        }
        assert!(peak_rss().is_some_and(|b| b > 0));
        assert!(process_major_faults().is_some());
        let (_, mem, kernel) = machine();
        assert!(mem > 0 && !kernel.is_empty());
        let (mountinfo, _) = cgroup_texts();
        assert!(!mountinfo.is_empty());
        assert!(free_bytes(Path::new("/")).is_some());
    }
}
