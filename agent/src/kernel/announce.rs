//! New-process announcements: the exec program writes a process's tgid to a ring buffer when
//! the kernel first sees it (or after it execs), so that userspace captures its mappings while
//! it still runs. The resolve stage polls this.
use agent_common::ProcessEvent;
use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

pub struct Announcements {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl Announcements {
    pub(super) fn new(ring: RingBuf<MapData>) -> Result<Announcements> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as
        // long as the AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("registering the process ring buffer: {e}"))?;
        Ok(Announcements { ring })
    }

    /// Waits until the kernel has announced something.
    pub async fn readable(&mut self) -> Result<()> {
        let mut guard = self.ring.readable_mut().await.context("polling the process ring buffer")?;
        guard.clear_ready();
        Ok(())
    }

    /// What was announced since the last call, oldest first.
    pub fn take(&mut self) -> Vec<ProcessEvent> {
        let ring = self.ring.get_mut();
        let mut events = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<ProcessEvent>() {
                // SAFETY: the kernel wrote a ProcessEvent (#[repr(C)], shared definition).
                events.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) });
            }
        }
        events
    }
}
