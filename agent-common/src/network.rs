//! Network stacks: the socket's last sender, and whom a transmit is attributed to.
use crate::SampleKey;

/// The last thread that sent on a socket, and its send stacks: transmit events are
/// attributed to it, because TCP often transmits a socket's data from softirq context on an
/// unrelated task (when ACKs arrive).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOwner {
    pub key: SampleKey,
    /// Interval (generation) in which the stacks were captured: they stay valid for it and
    /// the next one.
    pub generation: u32,
    pub _pad: u32,
}

/// Transmit events: `aux` says whom the event is attributed to.
pub mod attribution {
    /// The task current when the packet was queued.
    pub const CURRENT_TASK: u32 = 0;
    /// The last sender on the packet's socket, with its send stacks.
    pub const SOCKET_OWNER: u32 = 1;
}
