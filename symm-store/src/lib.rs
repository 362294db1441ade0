//! # symm-store (skeleton; being filled in)
mod store;
pub use store::{Result, Store, StoreError};
