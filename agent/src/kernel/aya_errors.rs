//! Error text for what the kernel refused: aya keeps an error's sources out of its Display.
/// Appends the sources of an error, which aya keeps out of its Display.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}
