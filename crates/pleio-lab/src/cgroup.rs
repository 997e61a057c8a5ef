//! A memory cap for child processes: a memory control group (cgroup v2, or
//! the v1 memory controller) with a hard limit, for measuring the "table
//! larger than RAM" case without a smaller machine.
//!
//! The group is created *inside* the calling process's own memory cgroup,
//! so it only ever narrows whatever limits already apply. Children spawned
//! through [`MemCap::confine`] join it between fork and exec. Page-cache
//! pages a child reads are charged to the group (unless already cached and
//! charged elsewhere: evict the file first), so at the limit the kernel
//! reclaims the child's cache, and anonymous memory beyond it gets the child
//! OOM-killed. Needs root (or a delegated cgroup) and a memory controller.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Smallest cap accepted: below this a child cannot even start.
pub const MIN_CAP: u64 = 1 << 20;

/// Errors creating, using or removing a memory cap.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// No usable memory controller (not mounted, or not enabled for children
    /// of this process's group).
    #[error("needs root and a memory cgroup controller: {detail}")]
    Unavailable {
        /// What was looked for and not found.
        detail: String,
    },
    /// The group could not be created: not root, or not delegated.
    #[error("needs root and a memory cgroup controller: cannot create {path}: {error}")]
    NotPermitted {
        /// The group directory.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// A cgroup file could not be read or written.
    #[error("{action} {path}: {error}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The cap is below [`MIN_CAP`].
    #[error("a memory cap of {bytes} bytes is too small (at least {MIN_CAP} bytes)")]
    TooSmall {
        /// The cap asked for.
        bytes: u64,
    },
}

/// Which cgroup interface the cap uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 memory controller (`memory.limit_in_bytes`).
    V1,
    /// The unified hierarchy (`memory.max`).
    V2,
}

/// Memory use of a capped group, as the kernel counts it (anonymous memory
/// and page cache charged to the group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemUsage {
    /// The limit in force (the cap rounded down to a page by the kernel).
    pub limit_bytes: u64,
    /// Bytes charged now.
    pub current_bytes: u64,
    /// Most bytes charged at once since the group was made (`memory.peak`,
    /// `memory.max_usage_in_bytes`); `None` on kernels without it.
    pub peak_bytes: Option<u64>,
    /// Processes the OOM killer killed in the group.
    pub oom_kills: u64,
    /// Times the usage hit the limit and the kernel had to reclaim
    /// (`memory.events` `max`, `memory.failcnt`).
    pub limit_hits: u64,
}

impl MemUsage {
    /// True while nothing in the group was OOM-killed: the work fitted.
    pub fn within_cap(&self) -> bool {
        self.oom_kills == 0
    }
}

/// A memory cgroup with a hard limit, removed on drop.
///
/// Wait for every child spawned into it before dropping it: a group with
/// live (or unreaped) processes cannot be removed and is left behind.
#[derive(Debug)]
pub struct MemCap {
    dir: PathBuf,
    version: CgroupVersion,
    limit: u64,
    removed: bool,
}

/// Where to create groups: the interface and the parent directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    version: CgroupVersion,
    /// Mount point of the hierarchy.
    mount: PathBuf,
    /// This process's group directory.
    own: PathBuf,
}

impl MemCap {
    /// Creates a group capped at `bytes` inside this process's memory
    /// cgroup, preferring v2 when its memory controller is available. The
    /// group does not swap (where the kernel offers the knob), so the cap
    /// cannot be dodged by swapping.
    pub fn new(bytes: u64) -> Result<MemCap, CgroupError> {
        if bytes < MIN_CAP {
            return Err(CgroupError::TooSmall { bytes });
        }
        let (mountinfo, cgroups) = crate::os::cgroup_texts();
        let loc = locate(&mountinfo, &cgroups)?;
        if loc.version == CgroupVersion::V2 {
            enable_v2_memory(&loc)?;
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "pleio-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = loc.own.join(name);
        fs::create_dir(&dir).map_err(|source| match source.kind() {
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
                CgroupError::NotPermitted {
                    path: dir.clone(),
                    error: source,
                }
            }
            _ => CgroupError::Io {
                action: "creating",
                path: dir.clone(),
                error: source,
            },
        })?;
        let mut cap = MemCap {
            dir,
            version: loc.version,
            limit: bytes,
            removed: false,
        };
        // No swap for the group: v2 caps it at 0; v1 gets swappiness 0 (a
        // memory+swap limit would do too, but then the kernel stops
        // counting limit hits in `memory.failcnt`).
        let (max, swap, no_swap) = match cap.version {
            CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.swappiness", "0"),
            CgroupVersion::V2 => ("memory.max", "memory.swap.max", "0"),
        };
        cap.write(max, &bytes.to_string())?;
        if cap.dir.join(swap).exists() {
            cap.write(swap, no_swap)?;
        }
        cap.limit = parse_limit(&cap.read(max)?).unwrap_or(bytes);
        Ok(cap)
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The interface in use.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The limit in force, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Makes the process `cmd` spawns join this group before it executes
    /// anything, so all its memory is charged here. Spawning fails if the
    /// kernel refuses the move. Returns `cmd` for chaining.
    pub fn confine<'a>(&self, cmd: &'a mut Command) -> Result<&'a mut Command, CgroupError> {
        let path = self.dir.join("cgroup.procs");
        let procs = File::options()
            .write(true)
            .open(&path)
            .map_err(|source| CgroupError::Io {
                action: "opening",
                path: path.clone(),
                error: source,
            })?;
        pleio::sys::join_cgroup_on_spawn(cmd, procs).map_err(|source| CgroupError::Io {
            action: "joining",
            path,
            error: source,
        })?;
        Ok(cmd)
    }

    /// The group's memory use so far.
    pub fn usage(&self) -> Result<MemUsage, CgroupError> {
        match self.version {
            CgroupVersion::V1 => Ok(MemUsage {
                limit_bytes: self.limit,
                current_bytes: self.read_u64("memory.usage_in_bytes")?,
                peak_bytes: self.read_u64("memory.max_usage_in_bytes").ok(),
                oom_kills: keyed(&self.read("memory.oom_control")?, "oom_kill").unwrap_or(0),
                limit_hits: self.read_u64("memory.failcnt")?,
            }),
            CgroupVersion::V2 => {
                let events = self.read("memory.events")?;
                Ok(MemUsage {
                    limit_bytes: self.limit,
                    current_bytes: self.read_u64("memory.current")?,
                    peak_bytes: self.read_u64("memory.peak").ok(),
                    oom_kills: keyed(&events, "oom_kill").unwrap_or(0),
                    limit_hits: keyed(&events, "max").unwrap_or(0),
                })
            }
        }
    }

    /// Removes the group, waiting up to a second for exiting processes to
    /// leave it. Dropping does the same, ignoring errors.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.try_remove()
    }

    fn try_remove(&mut self) -> Result<(), CgroupError> {
        if self.removed {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match fs::remove_dir(&self.dir) {
                Ok(()) => {
                    self.removed = true;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.removed = true;
                    return Ok(());
                }
                // EBUSY: processes still inside (dying ones leave shortly).
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(source) => {
                    return Err(CgroupError::Io {
                        action: "removing",
                        path: self.dir.clone(),
                        error: source,
                    })
                }
            }
        }
    }

    fn read(&self, file: &str) -> Result<String, CgroupError> {
        let path = self.dir.join(file);
        fs::read_to_string(&path).map_err(|source| CgroupError::Io {
            action: "reading",
            path,
            error: source,
        })
    }

    fn read_u64(&self, file: &str) -> Result<u64, CgroupError> {
        let s = self.read(file)?;
        s.trim().parse().map_err(|_| CgroupError::Io {
            action: "parsing",
            path: self.dir.join(file),
            error: io::Error::new(io::ErrorKind::InvalidData, format!("not a number: {s:?}")),
        })
    }

    fn write(&self, file: &str, value: &str) -> Result<(), CgroupError> {
        write_file(&self.dir.join(file), value)
    }
}

impl Drop for MemCap {
    fn drop(&mut self) {
        let _ = self.try_remove();
    }
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Io {
        action: "writing",
        path: path.to_path_buf(),
        error: source,
    })
}

/// The value of `key` in a `key value` per line file (`memory.events`,
/// `memory.oom_control`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A limit file's value: a number, or `max` (no limit) as `u64::MAX`.
fn parse_limit(s: &str) -> Option<u64> {
    match s.trim() {
        "max" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// Finds the memory hierarchy and this process's group in it from the
/// texts of `/proc/self/mountinfo` and `/proc/self/cgroup`. v2 wins when
/// its group lists the memory controller.
fn locate(mountinfo: &str, self_cgroup: &str) -> Result<Location, CgroupError> {
    let mut v1 = None;
    let mut v2 = None;
    for m in crate::os::mounts(mountinfo) {
        let memory = m.has_option("memory");
        let entry = (m.root, m.point);
        match m.fstype.as_str() {
            "cgroup2" if v2.is_none() => v2 = Some(entry),
            "cgroup" if v1.is_none() && memory => v1 = Some(entry),
            _ => {}
        }
    }
    let mut own_v1 = None;
    let mut own_v2 = None;
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(hier), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if hier == "0" && ctrls.is_empty() {
            own_v2 = Some(path.to_owned());
        } else if ctrls.split(',').any(|c| c == "memory") {
            own_v1 = Some(path.to_owned());
        }
    }
    let join = |(root, mount): (String, PathBuf), own: String, version| {
        // The group path is relative to the hierarchy's root; the mount may
        // show a subtree of it (containers): strip that prefix.
        let rel = own
            .strip_prefix(root.trim_end_matches('/'))
            .unwrap_or(&own)
            .trim_start_matches('/')
            .to_owned();
        Location {
            version,
            own: mount.join(rel),
            mount,
        }
    };
    if let (Some(m), Some(own)) = (v2.clone(), own_v2) {
        let loc = join(m, own, CgroupVersion::V2);
        let ctrls = fs::read_to_string(loc.own.join("cgroup.controllers")).unwrap_or_default();
        if ctrls.split_whitespace().any(|c| c == "memory") {
            return Ok(loc);
        }
    }
    if let (Some(m), Some(own)) = (v1, own_v1) {
        return Ok(join(m, own, CgroupVersion::V1));
    }
    Err(CgroupError::Unavailable {
        detail: match v2 {
            Some((_, mount)) => format!(
                "the cgroup2 hierarchy at {} offers no memory controller to this process's group, and no v1 memory controller is mounted",
                mount.display()
            ),
            None => "no cgroup2 hierarchy and no v1 memory controller is mounted".to_owned(),
        },
    })
}

/// Enables the memory controller for children of this process's v2 group
/// if it is not already (possible only where the group holds no processes,
/// or is the root).
fn enable_v2_memory(loc: &Location) -> Result<(), CgroupError> {
    let ctl = loc.own.join("cgroup.subtree_control");
    let on = fs::read_to_string(&ctl).unwrap_or_default();
    if on.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    fs::write(&ctl, "+memory").map_err(|e| CgroupError::Unavailable {
        detail: format!(
            "cannot enable the memory controller for children of {} ({e}); run pleio in a delegated cgroup, e.g. under `systemd-run --scope -p Delegate=yes`",
            loc.own.display()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pleio_testkit::skip;
    use std::io::Write;

    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_SELF: &str = "\
2:cpuacct:/
4:memory:/process_api/825e
1:cpu:/
0::/
";

    #[test]
    fn locates_the_v1_memory_group_in_a_hybrid_layout() {
        let loc = locate(HYBRID_MOUNTS, HYBRID_SELF).unwrap();
        // The unified hierarchy here has no memory controller (it is bound
        // to v1), unless this machine happens to offer one at its root.
        if loc.version == CgroupVersion::V1 {
            assert_eq!(loc.mount, Path::new("/sys/fs/cgroup/memory"));
            assert_eq!(loc.own, Path::new("/sys/fs/cgroup/memory/process_api/825e"));
        }
    }

    #[test]
    fn mount_roots_and_escapes_are_handled() {
        // A container seeing only its subtree, with a space in the mount path.
        let mounts = "40 1 0:33 /kube/pod1 /c\\040g/memory rw - cgroup cgroup rw,memory\n";
        let me = "7:memory:/kube/pod1/box\n";
        let loc = locate(mounts, me).unwrap();
        assert_eq!(loc.version, CgroupVersion::V1);
        assert_eq!(loc.own, Path::new("/c g/memory/box"));
        let none = locate("1 0 8:1 / / rw - ext4 /dev/vda rw\n", me).unwrap_err();
        assert!(
            none.to_string()
                .starts_with("needs root and a memory cgroup controller: "),
            "{none}"
        );
        // v2 whose group offers no memory controller, and no v1: unavailable.
        let v2 = "41 1 0:38 / /nonexistent/cg rw - cgroup2 cgroup2 rw\n";
        let e = locate(v2, "0::/a\n").unwrap_err();
        assert!(e.to_string().contains("no memory controller"), "{e}");
    }

    #[test]
    fn parses_keyed_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n";
        assert_eq!(keyed(events, "max"), Some(12));
        assert_eq!(keyed(events, "oom_kill"), Some(1));
        assert_eq!(keyed(events, "oom_group_kill"), None);
        assert_eq!(parse_limit("max\n"), Some(u64::MAX));
        assert_eq!(parse_limit("33554432\n"), Some(32 << 20));
        assert!(matches!(
            MemCap::new(1000),
            Err(CgroupError::TooSmall { .. })
        ));
    }

    /// A cap, or the test skipped saying why this machine cannot make one.
    macro_rules! cap_or_skip {
        ($bytes:expr) => {
            match MemCap::new($bytes) {
                Ok(c) => c,
                Err(e) => skip!("no memory cgroup here: {e}"),
            }
        };
    }

    /// A child reading a file three times the cap through the page cache
    /// runs to completion, charged up to the cap and never past it.
    #[test]
    fn page_cache_of_a_capped_child_stays_under_the_cap() {
        let cap_bytes = 32 << 20;
        let cap = cap_or_skip!(cap_bytes);
        // On the build's disk: a tmpfs TMPDIR cannot be evicted.
        let dir = pleio_testkit::disk_dir!();
        if let Err(e) = pleio_testkit::evictable(&dir) {
            skip!("{e}");
        }
        let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..3 * (cap_bytes >> 20) {
            f.write_all(&chunk).unwrap();
        }
        f.as_file().sync_all().unwrap();
        let len = 3 * cap_bytes;
        // The file must start uncached, or its pages stay charged to us.
        let cold = pleio::sys::evict(f.as_file(), 0..len)
            .ok()
            .and_then(|()| crate::residency::scan_file(f.as_file(), 0..len, 1).ok());
        if cold.is_none_or(|c| c.fraction() > 0.1) {
            skip!("cannot evict the temp file from the page cache here");
        }
        let mut cmd = Command::new("cat");
        cmd.arg(f.path()).stdout(std::process::Stdio::null());
        let status = cap.confine(&mut cmd).unwrap().status().unwrap();
        assert!(status.success(), "{status}");
        let u = cap.usage().unwrap();
        eprintln!("{:?} {u:?}", cap.version());
        assert!(u.within_cap(), "{u:?}");
        let peak = u.peak_bytes.expect("peak usage");
        assert!(peak <= u.limit_bytes, "{u:?}");
        // The child's cache really was charged here: it filled the group.
        assert!(peak >= u.limit_bytes / 2, "{u:?}");
        assert!(u.limit_hits > 0, "{u:?}");
        cap.remove().unwrap();
    }

    /// A child touching more anonymous memory than the cap is OOM-killed,
    /// and the usage says so.
    #[test]
    fn a_child_over_the_cap_is_oom_killed_and_reported() {
        let cap = cap_or_skip!(16 << 20);
        let dir = cap.path().to_path_buf();
        // 64 MB of 'a' held in a shell variable.
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "x=$(head -c 64000000 /dev/zero | tr '\\0' a); echo ${#x}",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        let status = cap.confine(&mut cmd).unwrap().status().unwrap();
        assert!(!status.success(), "{status}");
        let u = cap.usage().unwrap();
        assert!(u.oom_kills >= 1, "{u:?}");
        assert!(!u.within_cap());
        drop(cap);
        assert!(!dir.exists(), "group left behind");
    }

    #[test]
    fn a_refused_join_fails_the_spawn() {
        let cap = cap_or_skip!(MIN_CAP * 8);
        let dir = cap.path().to_path_buf();
        let mut cmd = Command::new("true");
        cap.confine(&mut cmd).unwrap();
        // Gone before the spawn: the child's join must fail, not run free.
        cap.remove().unwrap();
        assert!(!dir.exists());
        assert!(cmd.status().is_err());
    }
}
