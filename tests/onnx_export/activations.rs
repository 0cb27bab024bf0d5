//! `pi0d export --calibration`: the float model's largest activations per layer group, measured
//! on real inputs, against float16's range, and the precision the graphs need.

use super::*;
use pi0d::policy::export::atc::{F16Fit, F16_MAX};
use pi0d::policy::pi0::quant::Group;

fn with_calibration(case: &str, checkpoint: &Path, out: &Path) -> ExportOptions {
    let mut opts = options_for(case, out, ExportDtype::F32, false);
    opts.checkpoint = checkpoint.to_path_buf();
    // Another case's inputs than the graphs' own shapes come from: any inputs file fits.
    opts.calibration = vec![case_dir("pi0_f32_2cam_batch2").join("inputs.safetensors")];
    opts
}

#[test]
fn when_exported_with_calibration_expect_every_group_measured_and_float16_judged() {
    let case = "pi0_f32_1cam_short";
    let out = scratch_dir("activations-plain");
    let report = export(&with_calibration(case, &case_checkpoint(case), &out)).unwrap();
    let groups: Vec<Group> = report.activations.iter().map(|r| r.group).collect();
    assert_eq!(groups, Group::ALL.to_vec(), "{:?}", report.activations);
    for r in &report.activations {
        assert!(r.largest().is_finite() && r.largest() > 0.0, "{r:?}");
    }
    // The projector and heads have no norms; the towers do.
    for g in [Group::Vision, Group::Language, Group::Expert] {
        let r = report.activations.iter().find(|r| r.group == g).unwrap();
        assert!(
            r.stream > 0.0 && r.linear_in > 0.0 && r.linear_out > 0.0,
            "{r:?}"
        );
    }
    assert!(
        matches!(F16Fit::of(&report.activations), Some(F16Fit::Holds { .. })),
        "{:?}",
        report.activations
    );

    // One language layer's MLP output weights a hundred thousand times larger: its outputs,
    // and the residual stream after it, pass float16's range.
    let big = edited_checkpoint("activations-big", |tensors| {
        let t = tensors
            .iter_mut()
            .find(|t| {
                t.0.ends_with("language_model.layers.0.mlp.down_proj.weight")
            })
            .unwrap();
        for v in t.3.chunks_exact_mut(4) {
            let x = f32::from_le_bytes(v.try_into().unwrap()) * 1e5;
            v.copy_from_slice(&x.to_le_bytes());
        }
    });
    let out = scratch_dir("activations-big-graphs");
    let report = export(&with_calibration(case, &big, &out)).unwrap();
    let language = report
        .activations
        .iter()
        .find(|r| r.group == Group::Language)
        .unwrap();
    assert!(language.linear_out > F16_MAX, "{language:?}");
    match F16Fit::of(&report.activations) {
        Some(F16Fit::Overflows { group, .. }) => assert_eq!(group, Group::Language),
        other => panic!("{other:?}: {:?}", report.activations),
    }
}

#[test]
fn when_activations_are_judged_expect_the_boundaries_of_float16() {
    let range = |largest: f32| pi0d::policy::pi0::quant::ActivationRange {
        group: Group::Expert,
        stream: largest,
        linear_in: 1.0,
        linear_out: 1.0,
    };
    let fit = |largest: f32| F16Fit::of(&[range(1.0), range(largest)]);
    assert_eq!(F16Fit::of(&[]), None);
    assert!(matches!(fit(F16_MAX / 16.0), Some(F16Fit::Holds { .. })));
    assert!(matches!(
        fit(F16_MAX / 16.0 * 1.001),
        Some(F16Fit::Near { .. })
    ));
    assert!(matches!(fit(F16_MAX), Some(F16Fit::Near { .. })));
    assert!(matches!(
        fit(F16_MAX * 1.001),
        Some(F16Fit::Overflows { .. })
    ));
    assert!(matches!(fit(f32::INFINITY), Some(F16Fit::Overflows { .. })));
}

#[test]
fn when_atc_is_given_calibration_expect_the_prefix_inputs_written_as_the_graph_takes_them() {
    let dir = scratch_dir("atc-calibration");
    let bin = env!("CARGO_BIN_EXE_pi0d");
    let case = "pi0_f32_1cam_short";
    let inputs = case_dir(case).join("inputs.safetensors");
    let atc_export = |out: &Path, calibration: &Path| {
        Command::new(bin)
            .args([
                "export",
                "--cameras",
                "1",
                "--atc",
                "Ascend310B1",
                "--checkpoint",
            ])
            .arg(case_checkpoint(case))
            .arg("--out")
            .arg(out)
            .arg("--calibration")
            .arg(calibration)
            .output()
            .unwrap()
    };
    let out = atc_export(&dir, &inputs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = dir.join("calibration/prefix.cfg");
    // The prefix is calibrated by ATC (no `origin` then), the denoise graph compiled as before.
    assert!(
        stdout.contains(&format!(
            "--soc_version=Ascend310B1 --compression_optimize_conf={}",
            cfg.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("denoise_step --soc_version=Ascend310B1 --precision_mode_v2=origin"),
        "{stdout}"
    );
    // Every input of the prefix graph, in its order, type and shape.
    let m = Manifest::load(&dir).unwrap();
    let model = read_model(&dir.join(&m.graphs.prefix.file)).unwrap();
    let graph_inputs = model.input_names();
    let text = std::fs::read_to_string(&cfg).unwrap();
    let files: Vec<&str> = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("input_data_dir: "))
        .unwrap()
        .split(',')
        .collect();
    let shapes: Vec<&str> = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("input_shape: "))
        .unwrap()
        .split(';')
        .collect();
    assert!(text.contains("infer_soc: Ascend310B1"), "{text}");
    assert_eq!(files.len(), graph_inputs.len(), "{text}");
    let given = TensorFile::read(&inputs).unwrap();
    for ((file, shape), name) in files.iter().zip(&shapes).zip(&graph_inputs) {
        let (shape_name, dims) = shape.split_once(':').unwrap();
        assert_eq!(shape_name, name);
        let count: usize = dims
            .split(',')
            .map(|d| d.parse::<usize>().unwrap())
            .product();
        let bytes = std::fs::read(file).unwrap();
        let width = if name == "lang_tokens" { 8 } else { 4 };
        assert_eq!(bytes.len(), count * width, "{name}");
        // The image and the tokens are the inputs file's own values.
        match name.as_str() {
            "image0" => {
                let (_, want) = given.f32("image0", &[None, None, None, None]).unwrap();
                let got: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                assert_eq!(got, want, "{name}");
            }
            "lang_tokens" => {
                let (_, want) = given.i64("lang_tokens", &[None, None]).unwrap();
                let got: Vec<i64> = bytes
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                assert_eq!(got, want, "{name}");
            }
            _ => {}
        }
    }
    // A recording alone cannot give ATC's inputs; the export says so.
    let recording = dir.join("not-inputs.mcap");
    std::fs::write(&recording, b"\x89MCAP0\r\n").unwrap();
    let out = atc_export(&dir.join("again"), &recording);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--atc with --calibration")
            && stderr.contains("a recording gives the activation report only"),
        "{stderr}"
    );
    assert!(!dir.join("again").exists());
}
