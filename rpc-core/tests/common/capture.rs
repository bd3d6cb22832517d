//! A writer whose bytes the test reads back: what a server wrote to the device's stdout or
//! stderr (`Services::set_stdout`). Also workloads' `interleaving.rs` and plugin-contract
//! include this file.

// A test binary may use only part of it.
#![allow(dead_code)]

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Clones share one buffer: the server writes into one, the test reads another.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// Every byte written so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
    /// Every byte written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8(self.bytes()).unwrap()
    }
    /// The bytes written since the last `take`.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}
