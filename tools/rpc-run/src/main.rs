//! The `rpc-run` command: parses the command line, starts the watchdog, runs or inspects the
//! image (or lists the devices), and exits with the program's status or the failure's code
//! (see the library).

use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;

use rpc_run::{code, Failure, Options};

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let options = match Options::parse(std::env::args_os()) {
        Ok(options) => options,
        // `--help`: no error.
        Err(help) if !help.use_stderr() => {
            let _ = help.print();
            return ExitCode::SUCCESS;
        }
        // A usage error, with rpc-run's own code; the usage follows where clap left it out.
        Err(error) => {
            let text = error.render().to_string();
            eprint!("{text}");
            if !text.contains("Usage:") {
                eprintln!("\n{}", rpc_run::usage());
            }
            return ExitCode::from(code::USAGE);
        }
    };
    if options.devices {
        print!("{}", rpc_run::devices(&options.plugin, options.json));
        return ExitCode::SUCCESS;
    }
    if options.inspect {
        return match rpc_run::read_image(&options.image) {
            Ok((_, inspection)) => {
                print!("{inspection}");
                ExitCode::SUCCESS
            }
            Err(failure) => fail(&failure),
        };
    }
    // The watchdog: a thread blocked on a channel until the run ends or the time is up.
    let (_finished, watch) = mpsc::channel::<()>();
    if let Some(timeout) = options.timeout {
        std::thread::spawn(move || {
            if watch.recv_timeout(timeout) == Err(mpsc::RecvTimeoutError::Timeout) {
                let _ = std::io::stdout().flush();
                eprintln!("rpc-run: timed out after {:.1} s", timeout.as_secs_f64());
                std::process::exit(code::TIMEOUT.into());
            }
        });
    }
    match rpc_run::run_file(&options) {
        // The status as the shell sees it: its low 8 bits, as exit(3) would give.
        Ok(status) => {
            let _ = std::io::stdout().flush();
            ExitCode::from(status as u8)
        }
        Err(failure) => fail(&failure),
    }
}

fn fail(failure: &Failure) -> ExitCode {
    eprintln!("rpc-run: {failure}");
    ExitCode::from(failure.code())
}
