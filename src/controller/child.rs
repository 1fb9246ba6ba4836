//! The children a MyApp has.

use crate::Error;

/// A child of a MyApp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Child {
    Deployment,
    Service,
}

impl Child {
    /// Its kind, for people.
    pub(super) fn kind(self) -> &'static str {
        match self {
            Child::Deployment => "Deployment",
            Child::Service => "Service",
        }
    }

    /// Its write target in the metrics (a [`crate::metrics::WRITE_TARGETS`] name).
    pub(super) fn target(self) -> &'static str {
        match self {
            Child::Deployment => "deployment",
            Child::Service => "service",
        }
    }

    /// The error of a failed apply of it.
    pub(super) fn apply_failed(self, error: kube::Error) -> Error {
        match self {
            Child::Deployment => Error::ApplyDeployment(error),
            Child::Service => Error::ApplyService(error),
        }
    }
}
