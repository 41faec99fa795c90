//! Target-specific extensions: [`kqueue`] filters on the BSDs and Apple targets
//! (and on Linux against libkqueue, `--cfg pollshot_libkqueue`).

#[cfg(polling_kqueue)]
pub mod kqueue;

#[cfg(polling_kqueue)]
mod sealed {
    /// Only this crate's `Poller` implements the extension traits.
    pub trait PollerSealed {}

    impl PollerSealed for crate::Poller {}
}
#[cfg(polling_kqueue)]
pub(crate) use sealed::PollerSealed;
