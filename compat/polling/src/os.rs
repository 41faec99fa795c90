//! Target-specific extensions: `kqueue` filters on the BSDs and Apple targets
//! (and on Linux against libkqueue, `--cfg pollshot_libkqueue`), `iocp` posted
//! packets and waitable handles on Windows.

#[cfg(polling_kqueue)]
pub mod kqueue;

#[cfg(windows)]
pub mod iocp;
#[cfg(any(polling_kqueue, windows))]
mod sealed {
    /// Only this crate's `Poller` implements the extension traits.
    pub trait PollerSealed {}

    impl PollerSealed for crate::Poller {}
}
#[cfg(any(polling_kqueue, windows))]
pub(crate) use sealed::PollerSealed;
