use std::process::ExitCode;

use anyhow::Context;
use myapp_operator::{
    cli::{Cli, Command, Output},
    crd, run, telemetry,
};

fn main() -> ExitCode {
    match run_command() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", report(&error));
            ExitCode::FAILURE
        }
    }
}

fn run_command() -> anyhow::Result<()> {
    // One rustls crypto provider for the whole process: kube's client and the webhook server.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match Cli::parse_naming_env().command {
        Command::Crd => print!(
            "{}",
            crd::crd_yaml().context("failed to render the CRD as YAML")?
        ),
        Command::Certs(args) => {
            myapp_operator::certs::generate_for(&args.sans, args.ca_days, args.cert_days)?
                .write_new(&args.out, args.force)?;
            println!(
                "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key for: {1}",
                args.out.display(),
                args.sans.join(", ")
            );
        }
        Command::Check(args) => {
            let report = runtime(None)?.block_on(myapp_operator::check::run(&args))?;
            match args.output {
                Output::Text => print!("{}", report.text()),
                Output::Json => print!("{}", report.json()),
            }
            if !report.passed {
                std::process::exit(1);
            }
        }
        Command::Run(args) => {
            telemetry::init(args.log.log_format, &args.log.log_level)?;
            runtime(Some(args.worker_threads.into()))?.block_on(run::run(args))?;
        }
        #[cfg(feature = "dev")]
        Command::Dev(args) => {
            telemetry::init(args.log.log_format, &args.log.log_level)?;
            runtime(None)?.block_on(myapp_operator::dev::dev(args))?;
        }
    }
    Ok(())
}

/// The error and those of its causes that no message before already quotes. Our messages end
/// with their source's (`failed to read tls.crt: No such file or directory`), so anyhow's own
/// `Caused by:` list would print each text once per level of the chain.
fn report(error: &anyhow::Error) -> String {
    let mut printed: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !printed.iter().any(|p| p.contains(&text)) {
            printed.push(text);
        }
    }
    printed.join("\n\nCaused by: ")
}

/// The async runtime: `workers` threads, else one per core.
fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder
        .enable_all()
        .build()
        .context("failed to start the async runtime")
}
