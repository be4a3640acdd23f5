//! raidctl: the operator's CLI over raid-core and raid-gpu. No RAID logic
//! lives here: commands parse arguments, call the libraries and print.

mod selftest;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "raidctl",
    version,
    about = "Software RAID for NVMe with GPU parity offload"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check every parity kernel this CPU has against the scalar oracle
    /// (generation and every recovery case), and show each level's speed.
    Selftest {
        /// Data chunks per stripe.
        #[arg(long, default_value_t = 8)]
        width: usize,
        /// Chunk size in KiB.
        #[arg(long, default_value_t = 64)]
        chunk_kib: usize,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RAIDCTL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Selftest { width, chunk_kib } => selftest::run(width, chunk_kib * 1024),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raidctl: error: {e}");
            ExitCode::FAILURE
        }
    }
}
