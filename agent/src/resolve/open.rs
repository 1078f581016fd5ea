//! Opening the file behind a process's mapping, without letting the process choose another.
//!
//! `/proc/<pid>/map_files/<range>` is the mapped file itself, but opening it needs
//! CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE), which the shipped units do not grant. The
//! fallback is the maps line's path inside the process's root, and that path is the process's
//! to change: a container could leave a symlink to a host file, or mount another file over it.
//! So the path is resolved inside the process's root (`RESOLVE_IN_ROOT`: absolute symlinks and
//! `..` stay in it; `RESOLVE_NO_MAGICLINKS`: no /proc links out of it), and the file opened must
//! be the one the maps line names, by device and inode (map_files needs neither check).
//! Either way the file opened must be a regular file of a size an executable can have
//! (`untrusted`): the path may lead to a FIFO, and the mapped file may be a sparse giant.
use std::{
    ffi::CString,
    fs::{File, Metadata},
    io,
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::fs::MetadataExt,
    },
    path::Path,
};

use super::untrusted::{self, Refused, MAX_BINARY_BYTES};

/// Filesystems whose maps lines may show another device than `stat` (linux/magic.h): overlayfs
/// before 6.7 (the layer's device), btrfs (the filesystem's, not the subvolume's).
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;

/// The file a maps line names: its device ("fd:01", major:minor in hex) and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MappedId {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl MappedId {
    pub fn parse(device: &str, inode: u64) -> Option<MappedId> {
        let (major, minor) = device.split_once(':')?;
        Some(MappedId { major: u32::from_str_radix(major, 16).ok()?, minor: u32::from_str_radix(minor, 16).ok()?, inode })
    }

    /// Whether a file opened with `meta` is this one: the same inode, and the same device
    /// unless its filesystem shows maps another one.
    fn is(&self, meta: &Metadata, device_may_differ: bool) -> bool {
        let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
        meta.ino() == self.inode && ((major, minor) == (self.major, self.minor) || device_may_differ)
    }
}

/// Why a mapped file was not opened (each is counted; its frames keep module+offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unopened {
    /// The process is gone (nothing to count: its exit is).
    Exited,
    /// Its path does not reach a file inside the process's root (deleted, or a way out).
    Unreachable,
    /// Its path now reaches a different file than the one mapped.
    Changed,
    /// Not a regular file, too large, or too slow to open (`untrusted`).
    Refused(Refused),
}

impl Unopened {
    pub fn reason(self) -> &'static str {
        match self {
            Unopened::Exited => "exited",
            Unopened::Unreachable => "unreachable",
            Unopened::Changed => "changed",
            Unopened::Refused(refused) => refused.reason(),
        }
    }
}

/// Opens the file mapped at `range` ("start-end" as in maps), named `path` in the maps of
/// the process or thread /proc shows at `dir` (see `proc_dir`).
pub fn open_mapped(dir: &Path, range: &str, path: &str, mapped: MappedId) -> Result<File, Unopened> {
    match untrusted::open_regular(&dir.join("map_files").join(range), MAX_BINARY_BYTES) {
        Ok(file) => return Ok(file), // the mapped file itself
        Err(refused @ (Refused::NotRegular | Refused::TooLarge)) => return Err(Unopened::Refused(refused)),
        Err(_) => {}
    }
    let root = File::open(dir.join("root")).map_err(|_| Unopened::Exited)?;
    let file = open_in_root(&root, path).map_err(|_| Unopened::Unreachable)?;
    let meta = file.metadata().map_err(|_| Unopened::Unreachable)?;
    if !mapped.is(&meta, maps_shows_another_device(&file)) {
        return Err(Unopened::Changed);
    }
    untrusted::regular(file, MAX_BINARY_BYTES).map_err(Unopened::Refused)
}

/// `path` resolved as if `root` were `/`, read-only, without blocking (a FIFO opens at once).
pub fn open_in_root(root: &File, path: &str) -> io::Result<File> {
    let path = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 with a live directory fd, a NUL-terminated path and an open_how of the
    // size passed; it returns a new fd that nothing else owns, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_openat2, root.as_raw_fd(), path.as_ptr(), &how as *const libc::open_how, size_of::<libc::open_how>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

fn maps_shows_another_device(file: &File) -> bool {
    matches!(untrusted::filesystem_type(file), Some(OVERLAYFS_SUPER_MAGIC | BTRFS_SUPER_MAGIC))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped_as(meta: &Metadata) -> MappedId {
        MappedId { major: libc::major(meta.dev()), minor: libc::minor(meta.dev()), inode: meta.ino() }
    }

    #[test]
    fn parses_the_maps_device_field() {
        assert_eq!(MappedId::parse("fd:01", 42), Some(MappedId { major: 0xfd, minor: 1, inode: 42 }));
        assert_eq!(MappedId::parse("103:1f", 7), Some(MappedId { major: 0x103, minor: 0x1f, inode: 7 }));
        assert_eq!(MappedId::parse("fd01", 42), None);
        assert_eq!(MappedId::parse("zz:01", 42), None);
    }

    #[test]
    fn a_file_is_itself_and_not_another() {
        let this = std::fs::metadata("/proc/self/exe").unwrap();
        let other = std::fs::metadata("/bin/sh").unwrap();
        assert!(mapped_as(&this).is(&this, false));
        assert!(!mapped_as(&other).is(&this, false));
        // Another device with the same inode is the same file only where maps shows another.
        let elsewhere = MappedId { major: mapped_as(&this).major + 1, ..mapped_as(&this) };
        assert!(!elsewhere.is(&this, false));
        assert!(elsewhere.is(&this, true));
        assert!(!MappedId { inode: this.ino() + 1, ..elsewhere }.is(&this, true));
    }

    #[test]
    fn resolves_symlinks_inside_the_root_only() {
        let root = std::env::temp_dir().join(format!("ember-open-{}", std::process::id()));
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/inside"), "inside").unwrap();
        // Absolute and relative escapes both land inside the root, if anywhere.
        std::os::unix::fs::symlink("/etc/inside", root.join("absolute")).unwrap();
        std::os::unix::fs::symlink("../../../../etc/hostname", root.join("relative")).unwrap();
        let dir = File::open(&root).unwrap();
        assert_eq!(std::io::read_to_string(open_in_root(&dir, "/absolute").unwrap()).unwrap(), "inside");
        assert_eq!(open_in_root(&dir, "/relative").unwrap_err().kind(), io::ErrorKind::NotFound);
        // /proc/<pid>/root is a magic link: it would lead into another process's root.
        let host = File::open("/").unwrap();
        assert!(open_in_root(&host, "/etc/hostname").is_ok());
        assert_eq!(open_in_root(&host, "/proc/self/root/etc/hostname").unwrap_err().raw_os_error(), Some(libc::ELOOP));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
