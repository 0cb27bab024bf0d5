//! The command line as a person meets it: every argument of every subcommand explains itself
//! in `--help`, and only the options this build can honour are offered.

use clap::CommandFactory;

use crate::Cli;

/// Every argument (and every value of a value enum) under `cmd`, recursively, that has no
/// help text: `pi0d serve --arch`, not `--arch`.
fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    let path = format!("{path} {}", cmd.get_name());
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        if arg.get_help().is_none() && arg.get_long_help().is_none() {
            out.push(format!("{path} {id}"));
        }
        // Values explained one by one (a value enum's doc comments) must all be: `--help`
        // lists them as a table, where one without text is a blank row.
        let values = arg.get_possible_values();
        if values.iter().any(|v| v.get_help().is_some()) {
            for v in values
                .iter()
                .filter(|v| !v.is_hide_set() && v.get_help().is_none())
            {
                out.push(format!("{path} {id}={}", v.get_name()));
            }
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() != "help" {
            undocumented(sub, &path, out);
        }
    }
}

#[test]
fn when_any_subcommand_lists_its_arguments_expect_help_text_on_every_one() {
    let mut missing = Vec::new();
    undocumented(&Cli::command(), "", &mut missing);
    assert!(missing.is_empty(), "arguments without help: {missing:?}");
}

#[test]
fn when_the_walk_meets_an_argument_without_help_expect_it_reported() {
    // The check above can fail: an argument without a doc comment is caught.
    let cmd = clap::Command::new("t")
        .arg(clap::Arg::new("bare").long("bare"))
        .arg(
            clap::Arg::new("kind")
                .long("kind")
                .help("a kind")
                .value_parser([
                    clap::builder::PossibleValue::new("a").help("the first"),
                    clap::builder::PossibleValue::new("b"),
                ]),
        );
    let mut missing = Vec::new();
    undocumented(&cmd, "", &mut missing);
    assert_eq!(missing, [" t bare", " t kind=b"]);
}

fn serve_long_names() -> Vec<String> {
    let cli = Cli::command();
    let serve = cli
        .get_subcommands()
        .find(|c| c.get_name() == "serve")
        .expect("pi0d has a serve subcommand");
    serve
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect()
}

#[test]
fn when_serve_help_is_shown_expect_zenoh_options_only_in_a_zenoh_build() {
    let names = serve_long_names();
    for zenoh in ["zenoh", "zenoh-connect", "zenoh-listen"] {
        assert_eq!(
            names.iter().any(|n| n == zenoh),
            cfg!(feature = "zenoh"),
            "--{zenoh} in {names:?} (zenoh feature built: {})",
            cfg!(feature = "zenoh")
        );
    }
    let help = Cli::command()
        .find_subcommand_mut("serve")
        .expect("serve")
        .render_long_help()
        .to_string();
    assert_eq!(help.contains("--zenoh"), cfg!(feature = "zenoh"), "{help}");
}

#[cfg(not(feature = "zenoh"))]
#[test]
fn when_zenoh_is_asked_of_a_build_without_it_expect_a_usage_error_naming_the_option() {
    use clap::Parser;
    let e = match Cli::try_parse_from(["pi0d", "serve", "--checkpoint", "x", "--zenoh", "k"]) {
        Ok(_) => panic!("--zenoh accepted by a build without the zenoh feature"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    assert!(e.to_string().contains("--zenoh"), "{e}");
}
