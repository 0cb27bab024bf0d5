//! A private certificate authority for TLS tests, made with the `openssl` command: its own
//! certificate, and certificates it signs for 127.0.0.1 under a common name (a TLS server's, or
//! a client's for mutual TLS and Zenoh's access control by common name).

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct TestCa {
    dir: PathBuf,
    name: String,
    pub cert: PathBuf,
    key: PathBuf,
}

fn openssl(args: &[&std::ffi::OsStr]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn os(s: &str) -> &std::ffi::OsStr {
    s.as_ref()
}

impl TestCa {
    /// A CA named `name` (its files `<name>.pem`, `<name>-key.pem` in `dir`), valid 2 days.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        let subject = format!("/CN=pi0d test CA {name}");
        openssl(&[
            os("req"),
            os("-x509"),
            os("-newkey"),
            os("rsa:2048"),
            os("-nodes"),
            os("-days"),
            os("2"),
            os("-subj"),
            os(&subject),
            os("-keyout"),
            key.as_os_str(),
            os("-out"),
            cert.as_os_str(),
        ]);
        TestCa {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cert,
            key,
        }
    }

    /// A certificate for 127.0.0.1 with common name `cn`, signed by this CA: (certificate,
    /// private key), `<cn>.pem` and `<cn>-key.pem` beside the CA's.
    pub fn issue(&self, cn: &str) -> (PathBuf, PathBuf) {
        let d = &self.dir;
        let (cert, key) = (d.join(format!("{cn}.pem")), d.join(format!("{cn}-key.pem")));
        let (csr, ext) = (d.join(format!("{cn}.csr")), d.join(format!("{cn}.cnf")));
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let subject = format!("/CN={cn}");
        openssl(&[
            os("req"),
            os("-newkey"),
            os("rsa:2048"),
            os("-nodes"),
            os("-subj"),
            os(&subject),
            os("-keyout"),
            key.as_os_str(),
            os("-out"),
            csr.as_os_str(),
        ]);
        let serial = d.join(format!("{}.srl", self.name));
        openssl(&[
            os("x509"),
            os("-req"),
            os("-in"),
            csr.as_os_str(),
            os("-CA"),
            self.cert.as_os_str(),
            os("-CAkey"),
            self.key.as_os_str(),
            os("-CAserial"),
            serial.as_os_str(),
            os("-CAcreateserial"),
            os("-days"),
            os("2"),
            os("-out"),
            cert.as_os_str(),
            os("-extfile"),
            ext.as_os_str(),
        ]);
        (cert, key)
    }
}
