//! EXIT, ABORT, HOST_CALL / OFFLOAD_HOST_CALL and SYSTEM.

use std::ffi::CString;
use std::vec::Vec;

use super::{
    active, c_result, io, per_lane, recv_words, send_word0, until_nul, ExitPolicy, Refusals,
};
use crate::server::error::{Outcome, ServerError};
use crate::server::limits::{device_log, quoted};
use crate::server::request::Request;
use crate::sync::lock;

/// HOST_CALL's reply for a function that is not registered (or panicked): all ones.
pub const HOST_CALL_REFUSED: u64 = u64::MAX;

/// How a kernel ended itself, as recorded under [`ExitPolicy::Record`]: what
/// `PluginRuntime::synchronize` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelExit {
    /// EXIT with this status.
    Exit(i32),
    /// ABORT.
    Abort,
}

/// The handshake of EXIT and ABORT: C send; S recv; S send; C recv.
async fn handshake(req: &mut Request) -> Result<(), ServerError> {
    req.recv(|_, _| {}).await?;
    req.send(|_, _| {}).await
}

/// Ends the kernel per the policy: the process (after flushing the device's output), or a
/// record for the launcher.
fn finish(req: &Request, how: KernelExit) -> Result<(), ServerError> {
    let services = &req.context().services();
    match services.config().exit {
        ExitPolicy::Record => {
            device_log!(
                req.context().log_limit,
                Info,
                "mailbox {}: kernel ended with {how:?}",
                req.mailbox().id.0
            );
            *lock(&super::mailbox_state(req).exit) = Some(how);
            Ok(())
        }
        ExitPolicy::Process => {
            services.flush_std();
            // Not within the device log budget: the process ends, so there is one such line.
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
pub(crate) async fn exit(mut req: Request) -> Result<(), ServerError> {
    handshake(&mut req).await?;
    let words = recv_words(&mut req).await?;
    let status = words[req.first_lane() as usize][0] as u32 as i32;
    finish(&req, KernelExit::Exit(status))
}

/// ABORT: handshake; C send; S recv; then the exit policy.
pub(crate) async fn abort(mut req: Request) -> Result<(), ServerError> {
    handshake(&mut req).await?;
    req.recv(|_, _| {}).await?;
    finish(&req, KernelExit::Abort)
}

/// HOST_CALL and OFFLOAD_HOST_CALL: C send_n(argument block); C send buf\[0\] = function
/// address; S calls the function registered at that address (on an I/O thread: it may block);
/// S send buf\[0\] = result.
pub(crate) async fn host_call(mut req: Request) -> Result<Outcome, ServerError> {
    let args = req.recv_n().await?;
    let words = recv_words(&mut req).await?;
    let context = super::context(&req);
    let mut refusals = Refusals::default();
    let mut calls = Vec::new();
    for lane in active(&req) {
        let i = lane as usize;
        let addr = words[i][0];
        if args.refused() {
            refusals.lane(lane, super::OVER_BUDGET);
            continue;
        }
        let function = lock(&context.services().host_functions).get(&addr).cloned();
        match function {
            Some(function) => calls.push((lane, addr, function)),
            None => refusals.lane(
                lane,
                std::format!("no host function is registered at {addr:#x}"),
            ),
        }
    }
    let results = io(&req, !calls.is_empty(), move |_| {
        calls
            .into_iter()
            .map(|(lane, addr, function)| {
                let args = &args[lane as usize];
                let call = std::panic::AssertUnwindSafe(|| function(args));
                (lane, addr, std::panic::catch_unwind(call).ok())
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let mut replies = per_lane(&req, HOST_CALL_REFUSED);
    for (lane, addr, result) in results {
        match result {
            Some(result) => replies[lane as usize] = result,
            None => refusals.lane(lane, std::format!("host function at {addr:#x} panicked")),
        }
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

/// SYSTEM: C send_n(command); S send buf\[0\] = `system`'s status (run on an I/O thread), or
/// -1 unless allowed.
pub(crate) async fn system(mut req: Request) -> Result<Outcome, ServerError> {
    let commands = req.recv_n().await?;
    let context = super::context(&req);
    let allowed = context.services().config().allow_system;
    let mut refusals = Refusals::default();
    let mut run = Vec::new();
    for lane in active(&req) {
        let command: Vec<u8> = until_nul(&commands[lane as usize]).to_vec();
        if commands.refused() {
            refusals.lane(lane, super::OVER_BUDGET);
            continue;
        }
        if !allowed {
            refusals.lane(
                lane,
                std::format!(
                    "SYSTEM is not allowed by the server's policy: {}",
                    quoted(&command)
                ),
            );
            continue;
        }
        // `until_nul` removed every NUL, so this cannot fail.
        run.push((lane, CString::new(command).unwrap_or_default()));
    }
    let statuses = io(&req, !run.is_empty(), move |context| {
        // The command's output follows the device's, handed on in order (never waited for).
        context.services().hand_on_std();
        run.into_iter()
            .map(|(lane, command)| {
                // SAFETY: `command` is a valid NUL-terminated string for the duration of the
                // call.
                (lane, unsafe { libc::system(command.as_ptr()) })
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let mut replies = per_lane(&req, c_result(-1));
    for (lane, status) in statuses {
        replies[lane as usize] = c_result(status.into());
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}
