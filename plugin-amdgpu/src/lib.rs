//! `plugin-amdgpu`: AMD GPUs through the HSA runtime (`libhsa-runtime64.so.1`), loaded at run
//! time. So far: the loader table, the error type and the AQL packet encoding.

pub mod aql;
pub mod error;
pub mod loader;

pub use error::HsaError;
pub use loader::Hsa;
