//! EXIT, ABORT, HOST_CALL / OFFLOAD_HOST_CALL and SYSTEM.

use std::ffi::CString;
use std::vec::Vec;

use super::{
    active, c_result, recv_streams, recv_words, send_word0, until_nul, ExitPolicy, KernelExit,
    Refusals,
};
use crate::registry::Request;
use crate::sync::lock;
use crate::Result;

/// HOST_CALL's reply for a function that is not registered (or panicked, or whose argument
/// block is above the stream bound): all ones.
pub const HOST_CALL_REFUSED: u64 = u64::MAX;

/// The handshake of EXIT and ABORT: C send; S recv; S send; C recv.
fn handshake(req: &mut Request<'_, '_>) -> Result<()> {
    req.recv(|_, _| {})?;
    req.send(|_, _| {})
}

/// Ends the kernel per the policy: the process (after flushing the device's output), or a
/// record for the launcher.
fn finish(req: &mut Request<'_, '_>, how: KernelExit) -> Result<()> {
    let services = &super::context(req).services;
    match services.config().exit {
        ExitPolicy::Record => {
            log::info!("mailbox {}: kernel ended with {how:?}", req.mailbox().id.0);
            lock(&services.exits).insert(req.mailbox().id, how);
            Ok(())
        }
        ExitPolicy::Process => {
            services.flush_std();
            match how {
                KernelExit::Exit(status) => {
                    log::info!("device called exit({status}): ending the process");
                    std::process::exit(status)
                }
                KernelExit::Abort => {
                    log::error!("device called abort(): aborting the process");
                    std::process::abort()
                }
            }
        }
    }
}

/// EXIT: handshake; C send buf\[0\] low 32 bits = status; S recv; then the exit policy. The
/// first active lane's status counts.
pub(crate) fn exit(req: &mut Request<'_, '_>) -> Result<()> {
    handshake(req)?;
    let words = recv_words(req)?;
    let status = words[req.first_lane() as usize][0] as u32 as i32;
    finish(req, KernelExit::Exit(status))
}

/// ABORT: handshake; C send; S recv; then the exit policy.
pub(crate) fn abort(req: &mut Request<'_, '_>) -> Result<()> {
    handshake(req)?;
    req.recv(|_, _| {})?;
    finish(req, KernelExit::Abort)
}

/// HOST_CALL and OFFLOAD_HOST_CALL: C send_n(argument block); C send buf\[0\] = function
/// address; S calls the function registered at that address; S send buf\[0\] = result.
pub(crate) fn host_call(req: &mut Request<'_, '_>) -> Result<()> {
    let args = recv_streams(req)?;
    let words = recv_words(req)?;
    let services = &super::context(req).services;
    let bound = super::context(req).config.stream_bound;
    let mut refusals = Refusals::default();
    let mut replies = [HOST_CALL_REFUSED; 64];
    for lane in active(req) {
        let i = lane as usize;
        let addr = words[i][0];
        let function = lock(&services.host_functions).get(&addr).cloned();
        let Some(function) = function else {
            refusals.lane(
                lane,
                std::format!("no host function is registered at {addr:#x}"),
            );
            continue;
        };
        let args = match &args[i] {
            Ok(args) => args,
            Err(len) => {
                refusals.too_long(lane, *len, bound);
                continue;
            }
        };
        let call = std::panic::AssertUnwindSafe(|| function(args));
        match std::panic::catch_unwind(call) {
            Ok(result) => replies[i] = result,
            Err(_) => refusals.lane(lane, std::format!("host function at {addr:#x} panicked")),
        }
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

/// SYSTEM: C send_n(command); S send buf\[0\] = `system`'s status, or -1 unless allowed.
pub(crate) fn system(req: &mut Request<'_, '_>) -> Result<()> {
    let commands = recv_streams(req)?;
    let context = super::context(req);
    let allowed = context.services.config().allow_system;
    let mut refusals = Refusals::default();
    let mut replies = [c_result(-1); 64];
    for lane in active(req) {
        let command = match &commands[lane as usize] {
            Ok(command) => command,
            Err(len) => {
                refusals.too_long(lane, *len, context.config.stream_bound);
                continue;
            }
        };
        let command: Vec<u8> = until_nul(command).to_vec();
        if !allowed {
            refusals.lane(
                lane,
                std::format!(
                    "SYSTEM is not allowed by the server's policy: {:?}",
                    std::string::String::from_utf8_lossy(&command)
                ),
            );
            continue;
        }
        // `until_nul` removed every NUL, so this cannot fail.
        let command = CString::new(command).unwrap_or_default();
        context.services.flush_std();
        // SAFETY: `command` is a valid NUL-terminated string for the duration of the call.
        let status = unsafe { libc::system(command.as_ptr()) };
        replies[lane as usize] = c_result(status.into());
    }
    send_word0(req, &replies)?;
    refusals.finish()
}
