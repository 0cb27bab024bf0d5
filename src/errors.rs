//! Showing an error with its causes on one line, for logs that keep only text. A leaf module:
//! every layer may use it.

use std::error::Error;
use std::fmt;

/// `e` and each of its sources, `: `-separated; a source whose text already ends the line (an
/// error that also formats its cause) is not repeated.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut next = self.0.source();
        while let Some(s) = next {
            let text = s.to_string();
            if !line.ends_with(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            next = s.source();
        }
        f.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot publish")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn when_an_error_has_a_source_expect_both_once_on_one_line() {
        let e = Outer(std::io::Error::other("broken pipe"));
        assert_eq!(Chain(&e).to_string(), "cannot publish: broken pipe");
    }
}
