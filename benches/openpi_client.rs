//! pi0d's openpi client round trip against a server (`cargo bench --bench openpi_client --
//! --url ws://127.0.0.1:PORT [--n 300] [--cameras 2] [--size 224]`): each request carries that
//! many `size`x`size` RGB frames (already at the server's size: encode, send, receive and
//! decode only), the 7-joint state and a prompt. Prints one JSON line: round-trip median and
//! mean in ms. `tools/bench_openpi.py` runs it beside openpi's Python client on the same
//! server.

use std::sync::Arc;
use std::time::Instant;

use pi0d::config::OpenpiOptions;
use pi0d::observation::{CameraFrame, Observation, PixelFormat};
use pi0d::policy::openpi::OpenpiPolicy;
use pi0d::policy::Policy;
use pi0d::time::MonoTime;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let Some(url) = arg("--url") else {
        eprintln!("usage: cargo bench --bench openpi_client -- --url ws://HOST:PORT [--n N]");
        return;
    };
    let n: usize = arg("--n").and_then(|v| v.parse().ok()).unwrap_or(300);
    let cameras: usize = arg("--cameras").and_then(|v| v.parse().ok()).unwrap_or(2);
    let size: u32 = arg("--size").and_then(|v| v.parse().ok()).unwrap_or(224);
    let names: Vec<String> = (0..cameras).map(|i| format!("cam{i}")).collect();
    let opts = OpenpiOptions {
        url,
        api_key: None,
        ca_file: None,
        connect_timeout_s: 5.0,
        request_timeout_s: 10.0,
        reconnect_initial_s: 0.1,
        reconnect_max_s: 1.0,
        images: None,
        state_key: "observation/state".into(),
        prompt_key: "prompt".into(),
        extra: Vec::new(),
        image_size: size,
        action_dim: Some(7),
        max_reply_bytes: 16 << 20,
        zenoh: None,
    };
    // policy.chunk_steps = 50: the bench server answers [50, 8].
    let mut policy = OpenpiPolicy::new(&opts, &names, 7, 50, 0.02).expect("cameras map");
    let frame = |seed: u8| {
        Some(Arc::new(CameraFrame {
            stamp: MonoTime::now(),
            width: size,
            height: size,
            format: PixelFormat::Rgb8,
            data: (0..size * size * 3)
                .map(|i| (i as u8).wrapping_add(seed))
                .collect(),
        }))
    };
    let obs = Observation {
        stamp: MonoTime::now(),
        state: vec![0.1; 7],
        images: (0..cameras).map(|i| frame(i as u8)).collect(),
        prompt: "pick up the red cube and put it in the bowl".into(),
        rtc: None,
    };
    // Connect and warm up.
    for _ in 0..10 {
        policy.infer(&obs).expect("the server answers");
    }
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        policy.infer(&obs).expect("the server answers");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mean = ms.iter().sum::<f64>() / n as f64;
    ms.sort_by(f64::total_cmp);
    // The client's own work, without the network or the server: encoding the request and
    // decoding a reply like the server's ([50, 8] f32 with its timing).
    let reply = pi0d::policy::openpi::msgpack_numpy::encode(
        &pi0d::policy::openpi::msgpack_numpy::Out::Map(vec![
            (
                "actions".into(),
                pi0d::policy::openpi::msgpack_numpy::Out::Array(
                    pi0d::policy::openpi::msgpack_numpy::NdArray::f32(vec![50, 8], &[0.0; 400]),
                ),
            ),
            (
                "server_timing".into(),
                pi0d::policy::openpi::msgpack_numpy::Out::Map(vec![(
                    "infer_ms".into(),
                    pi0d::policy::openpi::msgpack_numpy::Out::Number(0.01),
                )]),
            ),
        ]),
    );
    let mut codec = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let bytes = policy.request(&obs);
        std::hint::black_box(bytes);
        policy.chunk(&reply, &obs).expect("decodes");
        codec.push(t.elapsed().as_secs_f64() * 1e3);
    }
    codec.sort_by(f64::total_cmp);
    println!(
        "{{\"n\": {n}, \"p50_ms\": {:.4}, \"mean_ms\": {mean:.4}, \"codec_p50_ms\": {:.4}}}",
        ms[n / 2],
        codec[n / 2]
    );
}
