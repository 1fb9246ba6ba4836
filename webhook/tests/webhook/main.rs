//! Integration tests of the webhook crate, over a tiny `Widget` type the crate knows nothing of.

mod connections;
mod https;
mod properties;
mod review;
mod rotation;
mod support;
