//! What the lab asks of the OS that the engine never does: process
//! counters and peak RSS (`/proc/self`), the machine's description, the
//! texts that locate this process's memory cgroup, the mounts, and free disk space
//! (`statvfs` through rustix's safe wrapper). Every reader answers `None`
//! (or empty) where the OS does not tell.
//!
//! The engine keeps what it calls itself (page size, advice, eviction,
//! residency, fault counters of one thread) in `pleio::sys`.

use std::path::{Path, PathBuf};

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

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The mounted subtree of its file system (`/` for the whole).
    pub root: String,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The file system type (`tmpfs`, `cgroup2`, ...).
    pub fstype: String,
    /// The file system's own options (`huge=within_size`, `memory`, ...).
    pub superopts: String,
}

impl Mount {
    /// The value of the file system option `key=value`, if given.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.superopts
            .split(',')
            .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
    }

    /// True if the file system option `name` (a bare flag) is given.
    pub fn has_option(&self, name: &str) -> bool {
        self.superopts.split(',').any(|o| o == name)
    }
}

/// The mounts in a text of `/proc/self/mountinfo`, in its order (later
/// mounts over earlier ones); malformed lines are skipped.
pub fn mounts(mountinfo: &str) -> impl Iterator<Item = Mount> + '_ {
    mountinfo.lines().filter_map(|line| {
        // id parent dev root mountpoint opts [optional...] - fstype src superopts
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let fstype = right.next()?;
        Some(Mount {
            root: unescape(left.get(3)?),
            point: PathBuf::from(unescape(left.get(4)?)),
            fstype: fstype.to_owned(),
            superopts: right.nth(1).unwrap_or("").to_owned(),
        })
    })
}

/// The mount `path` is on (the last mount of the longest mount point
/// holding it), if `/proc/self/mountinfo` tells.
pub fn mount_of(path: &Path) -> Option<Mount> {
    let path = std::fs::canonicalize(path).ok()?;
    let text = proc_text("/proc/self/mountinfo")?;
    let mut best: Option<Mount> = None;
    for m in mounts(&text) {
        let longer = best
            .as_ref()
            .is_none_or(|b| m.point.as_os_str().len() >= b.point.as_os_str().len());
        if path.starts_with(&m.point) && longer {
            best = Some(m);
        }
    }
    best
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
    fn mountinfo_lines_parse_with_escapes_and_options() {
        let text = "25 1 0:22 / /dev/shm rw,nosuid shared:4 - tmpfs tmpfs rw,size=1024k,huge=within_size\n\
                    26 1 0:23 /sub /my\\040dir rw - ext4 /dev/vda rw\n\
                    no separator here\n";
        let m: Vec<Mount> = mounts(text).collect();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].point, PathBuf::from("/dev/shm"));
        assert_eq!(
            (m[0].fstype.as_str(), m[0].option("huge")),
            ("tmpfs", Some("within_size"))
        );
        assert_eq!(m[0].option("size"), Some("1024k"));
        assert!(m[0].has_option("rw") && !m[0].has_option("huge"));
        assert_eq!(
            (m[1].root.as_str(), m[1].point.clone()),
            ("/sub", PathBuf::from("/my dir"))
        );
        assert_eq!(m[1].option("huge"), None);
    }

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
