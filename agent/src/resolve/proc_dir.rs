//! Where /proc shows a process's memory and root. Under /proc/<pid>, the kernel reads them
//! through the main thread: once that thread has exited while others run on (a `main` that
//! calls pthread_exit), maps reads empty and root and map_files fail. Each live thread's
//! /proc/<pid>/task/<tid> still shows them.
use std::{
    fs,
    path::{Path, PathBuf},
};

/// What `read` finds in the first of `tgid`'s directories that shows it: its own, then its
/// threads'.
pub fn first_showing<T>(tgid: u32, read: impl Fn(&Path) -> Option<T>) -> Option<T> {
    let own = PathBuf::from(format!("/proc/{tgid}"));
    if let Some(found) = read(&own) {
        return Some(found);
    }
    let main_thread = tgid.to_string();
    let mut threads = fs::read_dir(own.join("task")).ok()?.flatten().filter(|t| t.file_name() != main_thread.as_str());
    threads.find_map(|t| read(&t.path()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_the_process_directory_shows_and_else_asks_its_threads() {
        let me = std::process::id();
        assert_eq!(first_showing(me, |dir| Some(dir.to_path_buf())), Some(PathBuf::from(format!("/proc/{me}"))));
        // A thread of this process, as a worker seen when the main thread shows nothing. (Only
        // this one: the test harness's other threads may exit at any time.)
        let ((tid_tx, tid_rx), (tx, rx)) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let worker = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }.to_string()).unwrap();
            rx.recv().ok()
        });
        let tid = tid_rx.recv().unwrap();
        let shown = first_showing(me, |dir| (dir.file_name()? == tid.as_str()).then(|| dir.to_path_buf()));
        let shown = shown.expect("the worker's directory");
        assert_eq!(shown, PathBuf::from(format!("/proc/{me}/task/{tid}")));
        assert!(fs::read_to_string(shown.join("maps")).unwrap().contains("[stack]"));
        tx.send(()).unwrap();
        worker.join().unwrap();
        assert_eq!(first_showing(u32::MAX, |dir| fs::read_to_string(dir.join("maps")).ok()), None, "no such process");
    }
}
