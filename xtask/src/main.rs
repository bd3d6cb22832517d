//! Minimal entry point on the `bench` branch; the lead's real xtask dispatches `bench` the same way.

mod bench;
mod fuzz;
mod sanitize;
mod soak;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench") => bench::run(&args[1..]),
        Some("soak") => soak::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("sanitize") => sanitize::run(&args[1..]),
        _ => Err(
            "usage: cargo xtask bench [--quick] | soak [--seconds S] | fuzz [--seconds S] | sanitize [thread|address]"
                .to_string(),
        ),
    };
    if let Err(error) = result {
        eprintln!("xtask: {error}");
        std::process::exit(1);
    }
}
