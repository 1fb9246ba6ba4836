use anyhow::Context;
use clap::Parser;
use myapp_operator::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            let yaml =
                myapp_operator::crd::crd_yaml().context("failed to render the CRD as YAML")?;
            print!("{yaml}");
            Ok(())
        }
        Command::Certs(args) => {
            let bundle = myapp_operator::certs::generate(&args.sans)?;
            bundle.write_to(&args.out)?;
            println!(
                "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key for: {1}",
                args.out.display(),
                args.sans.join(", ")
            );
            Ok(())
        }
        Command::Run(_) | Command::Dev(_) => anyhow::bail!(
            "`run` is not built yet: the controller and webhook server arrive with their own \
             issues. Today this binary can only print the CRD (`myapp-operator crd`)."
        ),
    }
}
