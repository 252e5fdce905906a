//! The exclusive `flock` on `<database>-leader` that the leading process holds, as the Python
//! store does: the kernel frees it when the process dies, so a standby on the same host that
//! can take it knows the holder is gone and takes over without waiting for its lease.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The lock file's name: the database's real path with this appended.
const LOCK_SUFFIX: &str = "-leader";

/// The lock file of one store, owned by its thread.
pub(crate) struct LockFile {
    db_path: PathBuf,
    /// Known at the first [`LockFile::place`].
    path: Option<PathBuf>,
    place: Option<String>,
    /// The open file whose description holds the lock.
    held: Option<File>,
    /// This store leads (until [`LockFile::release`]): it wants the lock at each commit.
    pub(crate) keep: bool,
}

impl LockFile {
    pub(crate) fn new(db_path: &Path) -> LockFile {
        LockFile {
            db_path: db_path.to_path_buf(),
            path: None,
            place: None,
            held: None,
            keep: false,
        }
    }

    pub(crate) fn held(&self) -> bool {
        self.held.is_some()
    }

    /// This host and this lock file, `"<hostname> <boot id> <device>:<inode>"` (the leader
    /// row's `host`); `None` without a lock file or a boot id: then no lease of ours is cut
    /// short, and we never cut another's short.
    pub(crate) fn place(&mut self) -> Option<String> {
        if self.path.is_none() {
            let real = std::fs::canonicalize(&self.db_path).unwrap_or(self.db_path.clone());
            let mut name = OsString::from(real);
            name.push(LOCK_SUFFIX);
            let path = PathBuf::from(name);
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|b| b.trim().to_owned())
                .filter(|b| !b.is_empty());
            let stat = open(&path).and_then(|f| f.metadata().ok());
            if let (Some(boot), Some(stat)) = (boot, stat) {
                self.place = Some(format!(
                    "{} {boot} {}:{}",
                    hostname(),
                    stat.dev(),
                    stat.ino()
                ));
            }
            self.path = Some(path);
        }
        self.place.clone()
    }

    /// Takes the lock if it is free (or already ours); never blocks.
    pub(crate) fn take(&mut self) -> bool {
        if self.place.is_none() {
            return false;
        }
        if self.held.is_some() {
            return true;
        }
        let Some(file) = self.path.as_deref().and_then(open) else {
            return false;
        };
        // SAFETY: flock on a descriptor this function owns (`file`), with constant flags.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return false;
        }
        self.held = Some(file);
        true
    }

    /// Gives the lock up (closing its file), and stops wanting it.
    pub(crate) fn release(&mut self) {
        self.held = None;
        self.keep = false;
    }
}

/// The lock file opened read-write (created readable by all, as the Python store does: it
/// holds nothing), else read-only (enough for a local `flock`, on a file of another user).
fn open(path: &Path) -> Option<File> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
    {
        Ok(f) => Some(f),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => File::open(path).ok(),
        Err(_) => None,
    }
}

/// This host's name, as `socket.gethostname()` gives it.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is what is passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
