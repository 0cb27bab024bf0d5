//! tools/package.sh: the Debian package of the binary under test (amd64 here; arm64 is the
//! same script on the cross-compiled binary, its `--check` under qemu-user), its contents where
//! docs/deployment.md says, its glibc floor read from the binary, and its examples running from
//! the unpacked tree.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{root, scratch_dir};

/// The newest `GLIBC_x.y` version the binary's dynamic symbols need (from readelf's version
/// needs, not the objdump listing the script reads).
fn glibc_floor(binary: &Path) -> (u32, u32) {
    let out = Command::new("readelf")
        .arg("--version-info")
        .arg(binary)
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("Name: GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let v = rest.split_whitespace().next()?;
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max()
        .expect("the binary needs glibc")
}

#[test]
fn when_the_package_is_built_expect_the_deployment_layout_the_glibc_floor_and_examples_that_run() {
    // --check runs the simulated arm: one daemon at a time, as the other tests run theirs.
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("package");
    let binary = Path::new(env!("CARGO_BIN_EXE_pi0d"));
    let out = Command::new(root().join("tools/package.sh"))
        .args([
            "--arch",
            "amd64",
            "--compress",
            "none",
            "--check",
            "--binary",
        ])
        .arg(binary)
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    // --check ran the packaged binary: the sim config checked, 5 s of the simulated arm, a golden
    // case against lerobot's actions (what the arm64 package runs under qemu-user).
    for line in [
        "limit violations 0, exit clean",
        "max abs error against lerobot",
        "check: passed",
    ] {
        assert!(said.contains(line), "`{line}` not in:\n{said}");
    }
    let deb = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}: {said}", dir.display()));

    // The floor: read from the binary, stated by the package, old enough for Ubuntu 22.04
    // (glibc 2.35: Atlas 200I DK A2, Orange Pi AIpro, JetPack 6, ROS 2 Humble).
    let (major, minor) = glibc_floor(binary);
    let floor = format!("{major}.{minor}");
    assert!((major, minor) <= (2, 35), "needs glibc {floor}");
    let info = Command::new("dpkg-deb")
        .arg("-I")
        .arg(&deb)
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    for field in [
        "Package: pi0d",
        "Architecture: amd64",
        &format!("Depends: libc6 (>= {floor}), adduser"),
    ] {
        assert!(info.contains(field), "`{field}` not in:\n{info}");
    }
    assert!(said.contains(&format!("glibc: {floor} or newer")), "{said}");

    // Unpacked: where docs/deployment.md puts things.
    let unpacked = dir.join("root");
    let x = Command::new("dpkg-deb")
        .arg("-R")
        .arg(&deb)
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(x.success());
    for path in [
        "usr/bin/pi0d",
        "lib/systemd/system/pi0d.service",
        "etc/pi0d/pi0d.toml",
        "etc/pi0d/pi0d.env",
        "opt/pi0d/urdf/ur5e.urdf",
        "opt/pi0d/models",
        "usr/share/pi0d/config/sim.toml",
        "usr/share/pi0d/config/zenoh/robot-session.json5",
        "usr/share/pi0d/launch/pi0d.launch.py",
        "usr/share/pi0d/models/sim-reach/model.safetensors",
        "usr/share/doc/pi0d/docs/deployment.md",
    ] {
        assert!(unpacked.join(path).exists(), "{path} is not in the package");
    }
    let unit = std::fs::read_to_string(unpacked.join("lib/systemd/system/pi0d.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/pi0d run --config /etc/pi0d/pi0d.toml"),
        "{unit}"
    );
    let conffiles = std::fs::read_to_string(unpacked.join("DEBIAN/conffiles")).unwrap();
    assert_eq!(conffiles, "/etc/pi0d/pi0d.toml\n/etc/pi0d/pi0d.env\n");
    // Installing creates the user and its state directory, and enables nothing.
    let postinst = std::fs::read_to_string(unpacked.join("DEBIAN/postinst")).unwrap();
    assert!(postinst.contains("adduser --system"), "{postinst}");
    assert!(postinst.contains("/var/lib/pi0d"), "{postinst}");
    for never in [
        "systemctl enable",
        "systemctl start",
        "deb-systemd-helper enable",
    ] {
        assert!(!postinst.contains(never), "{postinst}");
    }

    // The packaged binary and examples work as unpacked: check the simulated arm's config.
    let check = Command::new(unpacked.join("usr/bin/pi0d"))
        .arg("check")
        .arg("--config")
        .arg(unpacked.join("usr/share/pi0d/config/sim.toml"))
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // The same script refuses a binary of another architecture.
    let wrong = Command::new(root().join("tools/package.sh"))
        .args(["--arch", "arm64", "--binary"])
        .arg(binary)
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("not arm64"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
}
