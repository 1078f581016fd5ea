//! Files a process can shape: its perf map, the files it maps, its /proc entries. Any of them
//! may be a FIFO (whose open waits for a writer for ever), a sparse file of many gigabytes, a
//! file that grows while it is read, or sit on a filesystem the process serves itself (FUSE in
//! a namespace of its own), where an open or a read may never return. So each is opened without
//! blocking and refused unless it is a regular file, and read with a byte cap. Opens run on a
//! worker thread that the caller waits for only until a deadline, and so do the reads of files a
//! process may serve (FUSE): a read that does not return costs a worker, never the drain. Other
//! reads run where they are asked for: a local disk may be slow under load (a cold binary of
//! 100 MB while its process starts), but it answers, and slowness is not hostility.
use std::{
    fs::File,
    io::{self, Read},
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::Path,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use crate::ops::metrics;

/// How long a caller waits for a worker's open, or its read of a file a process serves. An open
/// takes microseconds, and a daemon that serves files answers in milliseconds; one past this is
/// stuck.
const DEADLINE: Duration = Duration::from_millis(500);
/// Workers at most. Each stuck read holds one; with all of them stuck, reads are refused.
const MAX_WORKERS: usize = 8;
/// Bytes of perf maps read per interval, across every process: a map that grows without end
/// costs at most this much reading per drain.
const PERF_MAP_BYTES_PER_INTERVAL: u64 = 64 << 20;
/// `statfs`'s f_type of FUSE filesystems (linux/magic.h).
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Mapped files larger than this are not opened (no real executable comes near it; a sparse
/// file of 20 GiB does).
pub const MAX_BINARY_BYTES: u64 = 4 << 30;

/// Why a file a process can shape was not opened or read. Counted in
/// `ember_untrusted_files_refused_total` by `file` and `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not there, not reachable or not permitted (ENOENT, ELOOP, EACCES...): an ordinary miss.
    Failed(io::ErrorKind),
    /// A FIFO, socket or device.
    NotRegular,
    /// Larger than the file kind allows.
    TooLarge,
    /// Did not open or read within the deadline: given up for good.
    TooSlow,
    /// Every worker is held by a read that did not return.
    NoWorker,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Failed(_) => "failed",
            Refused::NotRegular => "not_regular",
            Refused::TooLarge => "too_large",
            Refused::TooSlow => "too_slow",
            Refused::NoWorker => "no_worker",
        }
    }

    /// Whether the file showed itself hostile (or the host overloaded): not to be tried again
    /// for the life of what refused it, and counted. Ordinary misses are neither.
    pub fn is_hostile(self) -> bool {
        !matches!(self, Refused::Failed(_))
    }

    /// Counts a hostile refusal of a `file` ("perf_map", "binary") of process `tgid`, and says
    /// so once (the caller does not try that file again).
    pub fn count(self, file: &'static str, tgid: u32) {
        if self.is_hostile() {
            tracing::warn!(tgid, file, reason = self.reason(), "a file of this process was refused: its frames there stay unnamed");
            metrics::add("ember_untrusted_files_refused_total", &[("file", file), ("reason", self.reason())], 1.0);
        }
    }
}

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Refused {
        Refused::Failed(e.kind())
    }
}

/// `file` if it is a regular file of at most `max` bytes.
pub fn regular(file: File, max: u64) -> Result<File, Refused> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(Refused::NotRegular);
    }
    if meta.len() > max {
        return Err(Refused::TooLarge);
    }
    Ok(file)
}

/// Opens `path` read-only without blocking (a FIFO opens at once).
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)
}

/// Opens `path` read-only without blocking, as a regular file of at most `max` bytes.
pub fn open_regular(path: &Path, max: u64) -> Result<File, Refused> {
    regular(open_nonblocking(path)?, max)
}

/// Up to `cap` bytes of a /proc file of a process (maps, status, stat, comm): the kernel writes
/// them, but the process decides how long they are (a maps line per mapping, up to 65,530 of
/// them, each with a path of its choosing). Past the cap, the text ends at its last complete
/// line, and the cut is counted.
pub fn read_proc(path: &Path, cap: usize) -> io::Result<String> {
    let mut bytes = Vec::new();
    open_nonblocking(path)?.take(cap as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > cap {
        let end = bytes[..cap].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        bytes.truncate(end);
        metrics::add("ember_untrusted_reads_capped_total", &[("file", "proc")], 1.0);
    }
    String::from_utf8(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// Bytes `start..` of `file` as the file is now: at most `cap` of them. Returns the file's
/// size and the bytes read (a file that grows while read is read to the size it had).
pub fn read_from(file: &File, start: u64, cap: usize) -> io::Result<(u64, Vec<u8>)> {
    let size = file.metadata()?.len();
    let want = size.saturating_sub(start).min(cap as u64) as usize;
    let mut bytes = vec![0; want];
    let mut done = 0;
    while done < want {
        match file.read_at(&mut bytes[done..], start + done as u64)? {
            0 => break, // shortened meanwhile
            n => done += n,
        }
    }
    bytes.truncate(done);
    Ok((size, bytes))
}

/// Perf map bytes that may still be read this interval: takes up to `want` of them.
pub fn take_perf_map_bytes(want: usize) -> usize {
    let mut left = PERF_MAP_BYTES_LEFT.load(Ordering::Relaxed);
    loop {
        let taken = left.min(want as u64);
        match PERF_MAP_BYTES_LEFT.compare_exchange_weak(left, left - taken, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                if taken < want as u64 {
                    metrics::add("ember_untrusted_reads_capped_total", &[("file", "perf_map")], 1.0);
                }
                return taken as usize;
            }
            Err(now) => left = now,
        }
    }
}

static PERF_MAP_BYTES_LEFT: AtomicU64 = AtomicU64::new(PERF_MAP_BYTES_PER_INTERVAL);
static INTERVAL: AtomicU64 = AtomicU64::new(0);

/// A new interval (at each drain): the per-interval caps start again.
pub fn new_interval() {
    PERF_MAP_BYTES_LEFT.store(PERF_MAP_BYTES_PER_INTERVAL, Ordering::Relaxed);
    INTERVAL.fetch_add(1, Ordering::Relaxed);
}

/// The current interval's number: a file read once in an interval holds every line written
/// before its samples were drained.
pub fn interval() -> u64 {
    INTERVAL.load(Ordering::Relaxed)
}

/// Whether `file` is on a filesystem a process may serve itself (FUSE), where a read may never
/// return. Asked on a worker, right after the open (asking FUSE may not return either).
pub fn served_by_a_process(file: &File) -> bool {
    filesystem_type(file) == Some(FUSE_SUPER_MAGIC)
}

/// The `statfs` f_type (linux/magic.h) of the filesystem `file` is on.
pub fn filesystem_type(file: &File) -> Option<i64> {
    // SAFETY: fstatfs fills the statfs struct it is given for a live fd.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        (libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(file), &mut fs) == 0).then_some(fs.f_type)
    }
}

/// Runs `read` (of a file `served_by_a_process` or not) on a worker under the deadline if a
/// process serves the file, else here.
pub fn read_with<T: Send + 'static>(served_by_a_process: bool, read: impl FnOnce() -> T + Send + 'static) -> Result<T, Refused> {
    if served_by_a_process { with_deadline(read) } else { Ok(read()) }
}

type Job = Box<dyn FnOnce() + Send>;

struct Workers {
    jobs: Mutex<mpsc::Sender<Job>>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    started: AtomicUsize,
    idle: Arc<AtomicUsize>,
}

impl Workers {
    fn get() -> &'static Workers {
        static WORKERS: OnceLock<Workers> = OnceLock::new();
        WORKERS.get_or_init(|| {
            let (jobs, queue) = mpsc::channel();
            Workers { jobs: Mutex::new(jobs), queue: Arc::new(Mutex::new(queue)), started: AtomicUsize::new(0), idle: Arc::new(AtomicUsize::new(0)) }
        })
    }

    /// One more worker, unless there are `MAX_WORKERS` already.
    fn start_one(&self) -> bool {
        if self.started.fetch_add(1, Ordering::Relaxed) >= MAX_WORKERS {
            self.started.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let (queue, idle) = (self.queue.clone(), self.idle.clone());
        idle.fetch_add(1, Ordering::Relaxed);
        // Each job marks its worker idle again itself, before its caller hears of it: the
        // caller's next job then finds the worker idle instead of starting another.
        let spawned = std::thread::Builder::new().name("ember-reader".into()).spawn(move || loop {
            let job = queue.lock().expect("reader queue").recv();
            let Ok(job) = job else { return };
            idle.fetch_sub(1, Ordering::Relaxed);
            job();
        });
        spawned.is_ok()
    }
}

/// Runs `job` (an open, or a read of a file a process serves) on a worker, and waits for it
/// until the deadline.
pub fn with_deadline<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Result<T, Refused> {
    let workers = Workers::get();
    if workers.idle.load(Ordering::Relaxed) == 0 && !workers.start_one() {
        return Err(Refused::NoWorker);
    }
    let (done, result) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        let value = job();
        Workers::get().idle.fetch_add(1, Ordering::Relaxed);
        let _ = done.send(value);
    });
    workers.jobs.lock().expect("reader jobs").send(job).map_err(|_| Refused::NoWorker)?;
    result.recv_timeout(DEADLINE).map_err(|_| Refused::TooSlow)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ember-untrusted-{name}-{}", std::process::id()))
    }

    #[test]
    fn a_fifo_opens_at_once_and_is_refused_as_are_symlink_loops_and_large_files() {
        let fifo = temp("fifo");
        let _ = std::fs::remove_file(&fifo);
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
        assert_eq!(open_regular(&fifo, u64::MAX).unwrap_err(), Refused::NotRegular);
        std::fs::remove_file(&fifo).unwrap();

        let looped = temp("loop");
        let _ = std::fs::remove_file(&looped);
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        let refused = open_regular(&looped, u64::MAX).unwrap_err();
        assert!(matches!(refused, Refused::Failed(_)) && !refused.is_hostile(), "{refused:?}");
        std::fs::remove_file(&looped).unwrap();

        let sparse = temp("sparse");
        File::create(&sparse).unwrap().set_len(20 << 30).unwrap();
        assert_eq!(open_regular(&sparse, MAX_BINARY_BYTES).unwrap_err(), Refused::TooLarge);
        std::fs::remove_file(&sparse).unwrap();
        assert_eq!(open_regular(Path::new("/dev/null"), u64::MAX).unwrap_err(), Refused::NotRegular);
        assert!(!served_by_a_process(&File::open("/proc/self/exe").unwrap()));
    }

    #[test]
    fn reads_are_capped_and_stop_at_the_size_the_file_had() {
        let path = temp("read");
        let mut file = File::create(&path).unwrap();
        file.write_all(b"0123456789").unwrap();
        let reader = open_regular(&path, u64::MAX).unwrap();
        assert_eq!(read_from(&reader, 2, 4).unwrap(), (10, b"2345".to_vec()));
        assert_eq!(read_from(&reader, 8, 100).unwrap(), (10, b"89".to_vec()));
        assert_eq!(read_from(&reader, 12, 100).unwrap(), (10, Vec::new()), "past the end");
        std::fs::remove_file(&path).unwrap();

        // /proc text past its cap ends at its last complete line.
        let maps = read_proc(Path::new("/proc/self/maps"), 200).unwrap();
        assert!(!maps.is_empty() && maps.len() <= 200 && maps.ends_with('\n'), "{maps:?}");
    }

    #[test]
    fn a_job_that_does_not_return_costs_its_caller_the_deadline_and_the_next_job_runs() {
        let (release, stuck) = mpsc::channel::<()>();
        let started = std::time::Instant::now();
        assert_eq!(with_deadline(move || stuck.recv().ok()).unwrap_err(), Refused::TooSlow);
        let waited = started.elapsed();
        assert!(waited >= DEADLINE && waited < DEADLINE * 4, "waited {waited:?}");
        assert_eq!(with_deadline(|| 42), Ok(42), "another worker takes the next job");
        for i in 0..1000 {
            assert_eq!(with_deadline(move || i), Ok(i));
        }
        // Had a worker been marked idle only after its caller heard back, a thousand calls in
        // a row would have started all of them.
        let started = Workers::get().started.load(Ordering::Relaxed);
        assert!(started < MAX_WORKERS, "{started} workers for one caller at a time and one stuck job");
        release.send(()).unwrap();
    }
}
