//! What every fuzz target shares.

/// Lets a stack overflow end as a crash with its input saved. Without a sanitizer, libFuzzer's
/// SIGSEGV handler runs on the overflowed stack and cannot; it keeps SA_ONSTACK from the
/// handler it replaces, so this installs the default action with SA_ONSTACK and an alternate
/// stack (for the fuzzing thread) before libFuzzer sets its handlers.
pub fn catch_stack_overflows() {
    const SIZE: usize = 1 << 16;
    let stack: &'static mut [u8] = Box::leak(vec![0u8; SIZE].into_boxed_slice());
    // SAFETY: the alternate stack lives for the whole process; the action is the default one.
    unsafe {
        let alternate = libc::stack_t { ss_sp: stack.as_mut_ptr().cast(), ss_flags: 0, ss_size: SIZE };
        assert_eq!(libc::sigaltstack(&alternate, std::ptr::null_mut()), 0, "sigaltstack");
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        action.sa_flags = libc::SA_ONSTACK;
        assert_eq!(libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut()), 0, "sigaction");
    }
}
