//! Output files that replace only what the user named, never leave a torn
//! or partial file, and tell each of several concurrent writers whether its
//! file is the one that landed.
//!
//! What happens to a destination path (docs/reliability.md, "Outputs",
//! says the same):
//!
//! - `-` is standard output, written directly.
//! - A character device or a FIFO, named directly or through symbolic links
//!   (`/dev/null`, `/dev/stdout` on a pipe or terminal), is opened and
//!   written directly: nothing is created, renamed or replaced.
//! - A symbolic link to anything else (a regular file, a directory, nothing)
//!   is refused: pleio neither replaces a link nor writes a file through
//!   one. Block devices, directories and sockets are refused.
//! - An absent path, or a regular file when the command may replace it, is
//!   written under an unpredictable temporary name in the destination's
//!   directory (created `O_CREAT | O_EXCL | O_NOFOLLOW`, mode `0666` less
//!   the umask), synced, and renamed into place by [`OutFile::commit`].
//!   The rename happens only if the path still holds what it held when the
//!   output was created (nothing: `RENAME_NOREPLACE`; a regular file: the
//!   same inode), checked under an exclusive `flock` of the directory that
//!   every pleio writer takes (waiting at most [`LOCK_WAIT`] for it, then
//!   going on without it). So of concurrent pleio writers to one path
//!   exactly one file lands, and every other writer fails (exit status 2)
//!   saying its output was discarded.
//! - A directory output ([`OutDir`], a checkpoint) is a temporary directory
//!   renamed into place only where nothing exists.
//! - The temporary file is removed when the output is dropped uncommitted
//!   (an error, a panic) and when the process gets SIGINT, SIGTERM or SIGHUP
//!   (a watcher thread removes every live temporary file, then lets the
//!   signal end the process as it would have).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use anyhow::{bail, Context, Result};
use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

/// Whether an existing regular file at the destination may be replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Only with `--force` (the flag's value).
    IfForced(bool),
    /// Always (charts and reports the command documents as replaced).
    Always,
}

impl Replace {
    fn allowed(self) -> bool {
        match self {
            Replace::IfForced(force) => force,
            Replace::Always => true,
        }
    }
}

/// What a destination path is, decided before anything is written.
enum Plan {
    /// Standard output.
    Stdout,
    /// A character device or FIFO: open it and write.
    Direct,
    /// Write a temporary file in `dir` and rename it to `name` if the path
    /// still holds `expect`.
    Replace {
        dir: PathBuf,
        name: OsString,
        expect: Expect,
    },
}

/// What the destination held when the output was planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Absent,
    File { dev: u64, ino: u64 },
}

/// Classifies `dest`: what writing to it would do, or why pleio refuses.
fn plan(dest: &Path, replace: Replace) -> Result<Plan> {
    if dest.as_os_str() == "-" {
        return Ok(Plan::Stdout);
    }
    let shown = dest.display();
    let st = match rustix::fs::lstat(dest) {
        Ok(st) => Some(st),
        Err(Errno::NOENT) => None,
        Err(e) => return Err(io::Error::from(e)).with_context(|| format!("{shown}")),
    };
    if st.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory) {
        bail!("{shown} is a directory");
    }
    let (dir, name) = split_dest(dest)?;
    let Some(st) = st else {
        return Ok(Plan::Replace {
            dir,
            name,
            expect: Expect::Absent,
        });
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile if replace.allowed() => Ok(Plan::Replace {
            dir,
            name,
            expect: Expect::File {
                dev: st.st_dev,
                ino: st.st_ino,
            },
        }),
        FileType::RegularFile => bail!("{shown} exists; pass --force to overwrite it"),
        FileType::Symlink => match rustix::fs::stat(dest).map(|t| FileType::from_raw_mode(t.st_mode)) {
            Ok(FileType::CharacterDevice | FileType::Fifo) => Ok(Plan::Direct),
            Ok(t) => bail!(
                "{shown} is a symbolic link to {}; pleio writes through links only to devices and FIFOs \
                 and never replaces a link: name the file itself, or `-` for standard output",
                describe(t)
            ),
            Err(_) => bail!(
                "{shown} is a symbolic link to nothing; pleio never replaces a link: name the file itself"
            ),
        },
        FileType::CharacterDevice | FileType::Fifo => Ok(Plan::Direct),
        t => bail!("{shown} is {}; pleio writes only regular files, character devices, FIFOs and `-`", describe(t)),
    }
}

fn describe(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "a special file",
    }
}

/// Where an output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Standard output.
    Stdout,
    /// A character device or FIFO, written directly.
    Device,
    /// A file in the destination's directory, renamed into place.
    File,
}

/// Checks, before a long run, that its output could be written to `dest`
/// (the same rules as [`OutFile::create`], nothing created), and says
/// where it would go.
pub fn check(dest: &Path, replace: Replace) -> Result<Kind> {
    Ok(match plan(dest, replace)? {
        Plan::Stdout => Kind::Stdout,
        Plan::Direct => Kind::Device,
        Plan::Replace { .. } => Kind::File,
    })
}

/// Checks a chart path before the work starts: a file name (charts are not
/// written to `-`, where the command's report goes), writable by the rules
/// above; an existing regular file there is replaced.
pub fn check_chart(dest: &Path) -> Result<()> {
    if dest.as_os_str() == "-" {
        bail!("--plot needs a file name (standard output carries the command's report)");
    }
    check(dest, Replace::Always).map(|_| ())
}

/// An output being written: the file to write, and how it is finished.
pub struct OutFile {
    file: File,
    dest: PathBuf,
    temp: Option<Temp>,
}

/// A temporary file in the destination's directory, removed unless renamed
/// into place.
struct Temp {
    dir: OwnedFd,
    name: OsString,
    dest_name: OsString,
    expect: Expect,
    /// Where the watcher finds it on a signal.
    path: PathBuf,
    /// A directory (removed with its contents), not a file.
    is_dir: bool,
    /// Renamed into place: nothing to remove.
    landed: bool,
}

impl OutFile {
    /// Opens `dest` for writing by the rules in the module docs.
    pub fn create(dest: &Path, replace: Replace) -> Result<OutFile> {
        let shown = dest.display();
        let (file, temp) = match plan(dest, replace)? {
            Plan::Stdout => {
                let fd = io::stdout()
                    .as_fd()
                    .try_clone_to_owned()
                    .context("standard output")?;
                (File::from(fd), None)
            }
            Plan::Direct => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc_flags(OFlags::NOCTTY))
                    .open(dest)
                    .with_context(|| format!("opening {shown}"))?;
                let st = rustix::fs::fstat(&file).with_context(|| format!("{shown}"))?;
                let t = FileType::from_raw_mode(st.st_mode);
                if !matches!(t, FileType::CharacterDevice | FileType::Fifo) {
                    bail!(
                        "{shown} changed to {} while being opened; nothing written",
                        describe(t)
                    );
                }
                (file, None)
            }
            Plan::Replace { dir, name, expect } => {
                let (file, temp) = Temp::create(&dir, name, expect).with_context(|| {
                    format!("creating a temporary file for {shown} in {}", dir.display())
                })?;
                (file, Some(temp))
            }
        };
        Ok(OutFile {
            file,
            dest: dest.to_path_buf(),
            temp,
        })
    }

    /// The file to write (the temporary file, the device, or stdout).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// True when the output goes to standard output.
    pub fn is_stdout(&self) -> bool {
        self.temp.is_none() && self.dest.as_os_str() == "-"
    }

    /// Finishes the output: a temporary file is synced and renamed into
    /// place if the destination still holds what it held at
    /// [`OutFile::create`]; otherwise it is removed and this is an error.
    pub fn commit(mut self) -> Result<()> {
        let shown = self.dest.display().to_string();
        let Some(temp) = self.temp.take() else {
            return Ok(());
        };
        self.file
            .sync_all()
            .with_context(|| format!("syncing {}", temp.path.display()))?;
        temp.land(&shown)
    }
}

/// An output directory being written (a checkpoint): an empty directory
/// under an unpredictable temporary name beside `dest`, removed with its
/// contents on drop and on SIGINT, SIGTERM or SIGHUP, and renamed to `dest`
/// by [`OutDir::commit`] only if nothing has appeared there meanwhile (not
/// even an empty directory). An existing `dest` is refused up front: pleio
/// never replaces a directory.
pub struct OutDir {
    dest: PathBuf,
    temp: Temp,
}

impl OutDir {
    /// Creates the temporary directory for `dest`, which must not exist.
    pub fn create(dest: &Path) -> Result<OutDir> {
        let shown = dest.display();
        if dest.as_os_str() == "-" {
            bail!("a checkpoint is a directory: name one (not `-`)");
        }
        match rustix::fs::lstat(dest) {
            Err(Errno::NOENT) => {}
            Ok(st) => bail!(
                "{shown} exists ({}); pleio never replaces a directory or anything else with a checkpoint: \
                 remove it or name another",
                describe(FileType::from_raw_mode(st.st_mode))
            ),
            Err(e) => return Err(io::Error::from(e)).with_context(|| format!("{shown}")),
        }
        let (dir, name) = split_dest(dest)?;
        let temp = Temp::create_dir(&dir, name).with_context(|| {
            format!(
                "creating a temporary directory for {shown} in {}",
                dir.display()
            )
        })?;
        Ok(OutDir {
            dest: dest.to_path_buf(),
            temp,
        })
    }

    /// The temporary directory to write into.
    pub fn path(&self) -> &Path {
        &self.temp.path
    }

    /// Renames the directory into place if `dest` is still absent;
    /// otherwise removes it and this is an error.
    pub fn commit(self) -> Result<()> {
        let shown = self.dest.display().to_string();
        self.temp.land(&shown)
    }
}

/// The directory and file name of a destination path.
fn split_dest(dest: &Path) -> Result<(PathBuf, OsString)> {
    let name = match dest.file_name() {
        Some(n) if !dest.as_os_str().as_bytes().ends_with(b"/") => n.to_os_string(),
        _ => bail!("{} does not name a file", dest.display()),
    };
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name))
}

/// `flags` as the raw bits `OpenOptionsExt::custom_flags` takes.
fn libc_flags(flags: OFlags) -> i32 {
    flags.bits() as i32
}

impl Temp {
    fn create(dir: &Path, dest_name: OsString, expect: Expect) -> Result<(File, Temp)> {
        Temp::create_with(dir, dest_name, expect, false, |dirfd, name| {
            rustix::fs::openat(
                dirfd,
                name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o666),
            )
            .map(File::from)
        })
    }

    /// A new empty directory (mode `0777` less the umask) under a
    /// temporary name.
    fn create_dir(dir: &Path, dest_name: OsString) -> Result<Temp> {
        Temp::create_with(dir, dest_name, Expect::Absent, true, |dirfd, name| {
            rustix::fs::mkdirat(dirfd, name, Mode::from_raw_mode(0o777))
        })
        .map(|((), t)| t)
    }

    /// Makes an entry with `make` under a fresh unpredictable name in
    /// `dir` (`make` fails with `EEXIST` if the name is taken).
    fn create_with<T>(
        dir: &Path,
        dest_name: OsString,
        expect: Expect,
        is_dir: bool,
        make: impl Fn(&OwnedFd, &OsStr) -> Result<T, Errno>,
    ) -> Result<(T, Temp)> {
        let dirfd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        // Keep the temporary name within NAME_MAX whatever the destination's.
        let stem: Vec<u8> = dest_name.as_bytes().iter().copied().take(160).collect();
        for _ in 0..64 {
            let mut name = OsString::from(".");
            name.push(OsStr::from_bytes(&stem));
            name.push(format!(".{:016x}.pleio-tmp", random_u64()));
            let path = dir.join(&name);
            // Created and registered under the registry lock, so a signal
            // watcher never misses an entry that exists.
            let mut live = registry();
            match make(&dirfd, name.as_os_str()) {
                Ok(made) => {
                    live.push(path.clone());
                    drop(live);
                    let temp = Temp {
                        dir: dirfd,
                        name,
                        dest_name,
                        expect,
                        path,
                        is_dir,
                        landed: false,
                    };
                    return Ok((made, temp));
                }
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        bail!("no free temporary name after 64 tries")
    }

    /// Renames the file into place if the destination is as expected.
    fn land(mut self, shown: &str) -> Result<()> {
        let discarded = |why: &str| {
            anyhow::anyhow!(
                "{shown} {why} while pleio was writing it (another writer?); \
                 this run's output was discarded and {shown} left as it is"
            )
        };
        {
            // Every pleio writer takes this lock for its check-and-rename,
            // so no other one lands between our check and our rename. File
            // systems without flock, and a lock held by someone else for
            // longer than LOCK_WAIT, get the check without the lock.
            let _lock = DirLock::take(&self.dir, LOCK_WAIT);
            match self.expect {
                Expect::Absent => match rename_noreplace(&self.dir, &self.name, &self.dest_name) {
                    Ok(()) => {}
                    Err(Errno::EXIST) => return Err(discarded("appeared")),
                    Err(e) => {
                        return Err(io::Error::from(e))
                            .with_context(|| format!("renaming the output into place as {shown}"))
                    }
                },
                Expect::File { dev, ino } => {
                    let now = rustix::fs::statat(
                        &self.dir,
                        self.dest_name.as_os_str(),
                        AtFlags::SYMLINK_NOFOLLOW,
                    );
                    match now {
                        Ok(st)
                            if st.st_dev == dev
                                && st.st_ino == ino
                                && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                        }
                        Ok(_) => return Err(discarded("was replaced")),
                        Err(_) => return Err(discarded("was removed")),
                    }
                    rustix::fs::renameat(
                        &self.dir,
                        self.name.as_os_str(),
                        &self.dir,
                        self.dest_name.as_os_str(),
                    )
                    .map_err(io::Error::from)
                    .with_context(|| format!("renaming the output into place as {shown}"))?;
                }
            }
        }
        // Landed: nothing to remove any more. The directory entry is made
        // durable where the file system allows.
        self.landed = true;
        let _ = rustix::fs::fsync(&self.dir);
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let mut live = registry();
        if !self.landed {
            if self.is_dir {
                let _ = std::fs::remove_dir_all(&self.path);
            } else {
                let _ = rustix::fs::unlinkat(&self.dir, self.name.as_os_str(), AtFlags::empty());
            }
        }
        live.retain(|p| p != &self.path);
    }
}

/// `renameat2(RENAME_NOREPLACE)`, or `link` + `unlink` where the file
/// system does not support the flag (both fail if `to` exists; a
/// directory cannot be linked, so there it fails rather than risk
/// replacing an empty directory).
fn rename_noreplace(dir: &OwnedFd, from: &OsStr, to: &OsStr) -> Result<(), Errno> {
    match rustix::fs::renameat_with(dir, from, dir, to, RenameFlags::NOREPLACE) {
        Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
            rustix::fs::linkat(dir, from, dir, to, AtFlags::empty())?;
            let _ = rustix::fs::unlinkat(dir, from, AtFlags::empty());
            Ok(())
        }
        r => r,
    }
}

/// How long a writer waits for the directory lock before going on without
/// it: another user may hold an `flock` on any directory they can read,
/// and a writer must never wait forever for them.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// An exclusive `flock` on a directory, released on drop.
struct DirLock<'a>(Option<&'a OwnedFd>);

impl<'a> DirLock<'a> {
    /// Takes the lock, polling without blocking for at most `wait`. Past
    /// that (someone else holds it), or where the file system has no
    /// `flock`, the caller goes on without it: its own checks
    /// (`RENAME_NOREPLACE`, the inode comparison) still hold, only the
    /// ordering between two pleio writers is lost.
    fn take(dir: &'a OwnedFd, wait: std::time::Duration) -> DirLock<'a> {
        let start = std::time::Instant::now();
        loop {
            match rustix::fs::flock(dir, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return DirLock(Some(dir)),
                Err(Errno::INTR) => continue,
                Err(Errno::WOULDBLOCK) if start.elapsed() < wait => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(_) => return DirLock(None),
            }
        }
    }
}

impl Drop for DirLock<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.0 {
            let _ = rustix::fs::flock(dir, FlockOperation::Unlock);
        }
    }
}

/// 64 bits no other user can predict: a hash keyed by the process's
/// random `RandomState` keys over the time, the process id and a counter.
fn random_u64() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static KEYS: OnceLock<std::hash::RandomState> = OnceLock::new();
    let mut h = KEYS.get_or_init(std::hash::RandomState::new).build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// Temporary files alive now, for the signal watcher; locking it starts
/// the watcher on first use.
fn registry() -> MutexGuard<'static, Vec<PathBuf>> {
    static LIVE: OnceLock<Mutex<Vec<PathBuf>>> = OnceLock::new();
    let live = LIVE.get_or_init(|| {
        start_watcher();
        Mutex::new(Vec::new())
    });
    live.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread that, on SIGINT, SIGTERM or SIGHUP, removes every live
/// temporary file and then ends the process the way the signal would have.
fn start_watcher() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("pleio-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                // Held until the process ends: no new temporary file appears
                // after the sweep.
                let live = registry();
                for p in live.iter() {
                    if std::fs::remove_file(p).is_err() {
                        let _ = std::fs::remove_dir_all(p);
                    }
                }
                let _ = signal_hook::low_level::emulate_default_handler(sig);
                std::process::exit(128 + sig);
            }
        });
}

/// Writes an output with `write` through a 1 MiB buffer (small outputs:
/// reports and charts), then commits it.
pub fn write_file(
    dest: &Path,
    replace: Replace,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    let out = OutFile::create(dest, replace)?;
    let mut w = BufWriter::with_capacity(1 << 20, out.file());
    write(&mut w).with_context(|| format!("writing {}", dest.display()))?;
    w.flush()
        .with_context(|| format!("writing {}", dest.display()))?;
    drop(w);
    out.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn write(out: &OutFile, bytes: &[u8]) {
        let mut f = out.file();
        f.write_all(bytes).unwrap();
    }

    fn temporaries(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".pleio-tmp")
            })
            .count()
    }

    #[test]
    fn a_new_file_lands_complete_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        let out = OutFile::create(&dest, Replace::IfForced(false)).unwrap();
        write(&out, b"hello");
        // Not visible at the destination until committed.
        assert!(!dest.exists());
        assert_eq!(temporaries(dir.path()), 1);
        out.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        assert_eq!(temporaries(dir.path()), 0);
        // Mode 0666 less the umask, as `File::create` gives, not the 0600
        // of a private temporary file.
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"").unwrap();
        let mode = |p: &Path| p.metadata().unwrap().permissions();
        assert_eq!(mode(&dest), mode(&plain));
    }

    #[test]
    fn an_uncommitted_output_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        std::fs::write(&dest, b"old").unwrap();
        let out = OutFile::create(&dest, Replace::IfForced(true)).unwrap();
        write(&out, b"half");
        drop(out);
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(temporaries(dir.path()), 0);
    }

    #[test]
    fn an_existing_file_needs_replace() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        std::fs::write(&dest, b"old").unwrap();
        let e = OutFile::create(&dest, Replace::IfForced(false))
            .err()
            .unwrap();
        assert!(e.to_string().contains("--force"), "{e}");
        for replace in [Replace::IfForced(true), Replace::Always] {
            let out = OutFile::create(&dest, replace).unwrap();
            write(&out, b"new");
            out.commit().unwrap();
            assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        }
    }

    #[test]
    fn a_destination_changed_meanwhile_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        // Absent at the start, then another writer's file appears.
        let out = OutFile::create(&dest, Replace::IfForced(true)).unwrap();
        write(&out, b"mine");
        std::fs::write(&dest, b"theirs").unwrap();
        let e = out.commit().unwrap_err().to_string();
        assert!(e.contains("appeared") && e.contains("discarded"), "{e}");
        assert_eq!(std::fs::read(&dest).unwrap(), b"theirs");
        // A file at the start, replaced by another writer's.
        let out = OutFile::create(&dest, Replace::IfForced(true)).unwrap();
        write(&out, b"mine");
        let other = dir.path().join("other");
        std::fs::write(&other, b"newer").unwrap();
        std::fs::rename(&other, &dest).unwrap();
        let e = out.commit().unwrap_err().to_string();
        assert!(e.contains("was replaced") && e.contains("discarded"), "{e}");
        assert_eq!(std::fs::read(&dest).unwrap(), b"newer");
        // Removed meanwhile.
        let out = OutFile::create(&dest, Replace::IfForced(true)).unwrap();
        std::fs::remove_file(&dest).unwrap();
        let e = out.commit().unwrap_err().to_string();
        assert!(e.contains("was removed"), "{e}");
        assert!(!dest.exists());
        assert_eq!(temporaries(dir.path()), 0);
    }

    #[test]
    fn kinds_of_destination() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(
            check(Path::new("-"), Replace::Always).unwrap(),
            Kind::Stdout
        );
        assert_eq!(check(&d.join("new"), Replace::Always).unwrap(), Kind::File);
        assert_eq!(
            check(Path::new("/dev/null"), Replace::IfForced(false)).unwrap(),
            Kind::Device
        );
        for bad in [d.to_path_buf(), d.join("."), d.join("sub/")] {
            assert!(check(&bad, Replace::Always).is_err(), "{}", bad.display());
        }
        let e = check(d, Replace::Always).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        std::os::unix::fs::symlink("/dev/null", d.join("null")).unwrap();
        assert_eq!(
            check(&d.join("null"), Replace::Always).unwrap(),
            Kind::Device
        );
        std::fs::write(d.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(d.join("file"), d.join("link")).unwrap();
        let e = check(&d.join("link"), Replace::Always)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link to a regular file"), "{e}");
        // Writing to /dev/null through a link leaves both as they were.
        let out = OutFile::create(&d.join("null"), Replace::Always).unwrap();
        write(&out, b"gone");
        out.commit().unwrap();
        let mut v = Vec::new();
        std::fs::File::open("/dev/null")
            .unwrap()
            .read_to_end(&mut v)
            .unwrap();
        assert!(v.is_empty());
        assert!(std::fs::symlink_metadata(d.join("null"))
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
