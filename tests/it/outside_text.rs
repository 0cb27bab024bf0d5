//! Text from outside reaches the operator's terminal as data, through the real binary on a
//! pseudo-terminal: a hostile openpi server's metadata, error frames and close reasons (`pi0d
//! check` and `pi0d run`), a checkpoint's step names, a configuration's text and a file's name
//! each carry escape sequences (a window title, a screen clear, a cursor move, a
//! right-to-left override, a line of their own) and a 1 MiB line. Nothing of them acts on
//! the terminal: each is shown escaped, and the long one cut with its size said.

use crate::common;

use std::net::{TcpListener, TcpStream};
use std::process::Command;

use common::procs::{pi0d, write_config};
use common::pty;
use pi0d::policy::openpi::msgpack_numpy::{self, Out};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::{Message, WebSocket};

/// What the tests look for on the screen: present only as `\x1b]0;PWNED`, escaped.
const MARKER: &str = "PWNED";
/// A screen's worth of output, far below the 1 MiB each hostile source sends.
const SCREEN_BYTES: usize = 256 * 1024;

/// Escape sequences, a line of its own and `pad` bytes after them.
fn hostile(pad: usize) -> String {
    format!(
        "\x1b]0;{MARKER}\x07\x1b[2J\x1b[H\u{202e}evil\r\nERROR pi0d: fake line\r{}",
        "x".repeat(pad)
    )
}

/// An openpi server on a loopback port: its metadata hostile; its first two connections
/// (`check`'s probe, `run`'s warm-up) answer each request with a hostile 1 MiB error text,
/// the later ones close with a hostile reason.
fn hostile_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(conn) = conn else { continue };
            std::thread::spawn(move || {
                if let Ok(ws) = tungstenite::accept(conn) {
                    serve(ws, n >= 2);
                }
            });
        }
    });
    port
}

fn serve(mut ws: WebSocket<TcpStream>, close: bool) {
    let metadata = msgpack_numpy::encode(&Out::Map(vec![
        ("policy".into(), Out::Text(hostile(0))),
        ("notes".into(), Out::Text(hostile(1 << 20))),
    ]));
    if ws.send(Message::Binary(metadata)).is_err() {
        return;
    }
    loop {
        match ws.read() {
            Ok(Message::Binary(_)) => {}
            Ok(_) => continue,
            Err(_) => return,
        }
        let sent = if close {
            // A close reason is at most 123 bytes.
            let mut reason = hostile(0);
            reason.truncate(100);
            ws.close(Some(CloseFrame {
                code: CloseCode::Error,
                reason: reason.into(),
            }))
        } else {
            ws.send(Message::Text(hostile(1 << 20)))
        };
        if sent.is_err() {
            return;
        }
    }
}

fn openpi_config(port: u16) -> toml::Table {
    use toml::Value;
    common::remote_policy_config(
        "openpi",
        &[
            ("url", Value::String(format!("ws://127.0.0.1:{port}"))),
            ("connect_timeout_s", Value::Float(1.0)),
            ("request_timeout_s", Value::Float(1.0)),
            ("reconnect_initial_s", Value::Float(0.1)),
            ("reconnect_max_s", Value::Float(0.2)),
        ],
    )
}

fn check(config: &std::path::Path) -> Command {
    let mut c = pi0d();
    c.args(["check", "--config"]).arg(config);
    c
}

#[test]
fn when_an_openpi_server_sends_escapes_and_a_megabyte_expect_check_and_run_to_show_them_inert() {
    let port = hostile_server();
    let dir = common::scratch_dir("outside-openpi");
    let config = write_config(&dir, &openpi_config(port));

    let screen = pty::run(check(&config), 60.0);
    screen.assert_inert(MARKER, SCREEN_BYTES);
    let text = screen.text();
    assert!(text.contains("metadata: policy=\\x1b]0;PWNED"), "{text}");
    assert!(text.contains("bytes, first 512 shown"), "{text}");

    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = pi0d();
    run.args(["run", "--config"])
        .arg(&config)
        .args(["--duration", "3"]);
    let screen = pty::run(run, 60.0);
    screen.assert_inert(MARKER, SCREEN_BYTES);
    let text = screen.text();
    // The server's words were shown (escaped): its metadata, its error text, its close reason.
    assert!(text.contains("connected to the policy server"), "{text}");
    assert!(
        text.contains("the server answered with an error: \\x1b]0;PWNED"),
        "{text}"
    );
    assert!(text.contains("(1011: \\x1b]0;PWNED"), "{text}");
}

/// The bundled random-weight model, copied to be edited.
fn tiny_model(name: &str) -> common::TempDir {
    common::copied_checkpoint(&common::root().join("models/tiny-pi0"), name)
}

fn model_config(model: &std::path::Path) -> toml::Table {
    let mut cfg = common::sim_model_config();
    cfg["policy"]["checkpoint"] = toml::Value::String(model.display().to_string());
    cfg
}

#[test]
fn when_a_checkpoint_names_a_step_with_escapes_and_a_megabyte_expect_the_refusal_inert() {
    let model = tiny_model("outside-step");
    common::edit_json(&model.join("policy_preprocessor.json"), |p| {
        p["steps"][1]["registry_name"] = serde_json::Value::String(hostile(1 << 20));
    });
    let dir = common::scratch_dir("outside-step-config");
    let config = write_config(&dir, &model_config(&model));
    let screen = pty::run(check(&config), 60.0);
    assert_eq!(screen.status.code(), Some(1), "{}", screen.text());
    screen.assert_inert(MARKER, SCREEN_BYTES);
    let text = screen.text();
    assert!(
        text.contains("policy_preprocessor.json, step 1 (`\\x1b]0;PWNED"),
        "{text}"
    );
    assert!(text.contains("bytes, first 128 shown"), "{text}");
}

#[test]
fn when_a_checkpoint_asks_for_a_million_prompt_tokens_expect_it_refused_naming_the_bound() {
    let model = tiny_model("outside-prompt-tokens");
    common::edit_json(&model.join("config.json"), |c| {
        c["tokenizer_max_length"] = serde_json::json!(1_000_000);
    });
    let dir = common::scratch_dir("outside-prompt-tokens-config");
    let config = write_config(&dir, &model_config(&model));
    let out = check(&config).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("config.json"), "{text}");
    assert!(
        text.contains("`tokenizer_max_length`: expected at most 2048"),
        "{text}"
    );
    assert!(text.contains("found 1000000"), "{text}");
    // The same through the tokenizer step's own setting.
    let model = tiny_model("outside-step-tokens");
    common::edit_json(&model.join("policy_preprocessor.json"), |p| {
        p["steps"][3]["config"]["max_length"] = serde_json::json!(1_000_000);
    });
    let config = write_config(&dir, &model_config(&model));
    let out = check(&config).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "step 3 (`tokenizer_processor`): setting `max_length`: expected a count from 1 to 2048"
        ),
        "{text}"
    );
}

#[test]
fn when_a_config_file_and_its_name_hold_escapes_expect_both_shown_inert() {
    let dir = common::scratch_dir("outside-config");
    let name = format!("\x1b]0;{MARKER}\x07\x1b[2J.toml");
    let path = dir.join(&name);
    // Raw control characters are not TOML: the parser's message quotes the line.
    std::fs::write(&path, format!("[robot]\nurdf = \"{}\"\n", hostile(1 << 20))).unwrap();
    let screen = pty::run(check(&path), 60.0);
    assert_eq!(screen.status.code(), Some(1), "{}", screen.text());
    screen.assert_inert(MARKER, SCREEN_BYTES);
    assert!(
        screen.text().contains("\\x1b]0;PWNED\\x07\\x1b[2J.toml"),
        "{}",
        screen.text()
    );
    // A file that is not there: its name alone.
    let missing = dir.join(format!("missing-\x1b]0;{MARKER}\x07.toml"));
    let screen = pty::run(check(&missing), 60.0);
    assert_ne!(screen.status.code(), Some(0), "{}", screen.text());
    screen.assert_inert(MARKER, SCREEN_BYTES);
    assert!(
        screen.text().contains("missing-\\x1b]0;PWNED"),
        "{}",
        screen.text()
    );
}
