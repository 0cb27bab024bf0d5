//! Relative ("delta") actions as lerobot 0.6.1's `relative_actions_processor` /
//! `absolute_actions_processor` pair computes them (a port of openpi's `DeltaActions` /
//! `AbsoluteActions`): the model predicts `action - state` for the masked dimensions, and the
//! postprocessor adds back the state of the observation the chunk came from. openpi's
//! `DeltaActions` / `AbsoluteActions`, which its checkpoints do not record, are the same with a
//! mask the configuration declares.

use crate::policy::pi0::normalize::Normalization;

/// The relative step's settings, as saved.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RelativeStep {
    pub(crate) enabled: bool,
    /// Names whose actions stay absolute (matched case-insensitively, as substrings).
    pub(crate) exclude_joints: Vec<String>,
    /// The action dimensions' names (the dataset's), which `exclude_joints` is matched against.
    pub(crate) action_names: Option<Vec<String>>,
    /// openpi's `DeltaActions` / `AbsoluteActions` instead of lerobot's steps.
    pub(crate) openpi: Option<OpenpiDelta>,
}

/// openpi's delta actions, declared by the configuration (`make_bool_mask`'s mask).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OpenpiDelta {
    /// Per action dimension from the first; dimensions past it stay absolute.
    pub(crate) mask: Vec<bool>,
    /// openpi's state normalization: its outputs carry the normalized state, unnormalized
    /// again before `AbsoluteActions` adds it.
    pub(crate) state: Normalization,
}

impl RelativeStep {
    /// Which of `action_dim` dimensions are relative, built exactly as lerobot's `_build_mask`:
    /// without exclusions or without names every dimension is; a name is excluded when any
    /// non-empty lower-cased token equals it or is a substring of it (lower-cased); dimensions
    /// past the names are relative.
    pub(crate) fn mask(&self, action_dim: usize) -> Vec<bool> {
        if let Some(o) = &self.openpi {
            let mut m: Vec<bool> = o.mask.iter().copied().take(action_dim).collect();
            m.resize(action_dim, false);
            return m;
        }
        let tokens: Vec<String> = self
            .exclude_joints
            .iter()
            .filter(|t| !t.is_empty())
            .map(|t| t.to_lowercase())
            .collect();
        let (Some(names), false) = (&self.action_names, tokens.is_empty()) else {
            return vec![true; action_dim];
        };
        let mut mask: Vec<bool> = names
            .iter()
            .take(action_dim)
            .map(|n| {
                let n = n.to_lowercase();
                !tokens.iter().any(|t| n.contains(t.as_str()))
            })
            .collect();
        mask.resize(action_dim, true);
        mask
    }
}

impl RelativeStep {
    /// The state this step keeps for the absolute step, from the state as it reaches it (for
    /// openpi, the state after its normalization round trip).
    pub(crate) fn kept(&self, state: &[f32]) -> Vec<f32> {
        let mut s = state.to_vec();
        if let Some(o) = &self.openpi {
            o.state.normalize(&mut s);
            o.state.unnormalize(&mut s);
        }
        s
    }
}

/// A mask with the state it is taken against.
pub(crate) struct Offsets<'a> {
    pub(crate) mask: &'a [bool],
    pub(crate) state: &'a [f32],
}

impl Offsets<'_> {
    /// `row[i] += state[i]` where the mask is set (lerobot's `to_absolute_actions`: the state
    /// times the 0/1 mask, added in float32).
    pub(crate) fn to_absolute(&self, row: &mut [f32]) {
        for ((x, &m), &s) in row.iter_mut().zip(self.mask).zip(self.state) {
            *x += s * f32::from(u8::from(m));
        }
    }

    /// `row[i] -= state[i]` where the mask is set (`to_relative_actions`).
    pub(crate) fn to_relative(&self, row: &mut [f32]) {
        for ((x, &m), &s) in row.iter_mut().zip(self.mask).zip(self.state) {
            *x -= s * f32::from(u8::from(m));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(exclude: &[&str], names: Option<&[&str]>) -> RelativeStep {
        RelativeStep {
            enabled: true,
            exclude_joints: exclude.iter().map(|s| s.to_string()).collect(),
            action_names: names.map(|n| n.iter().map(|s| s.to_string()).collect()),
            openpi: None,
        }
    }

    #[test]
    fn when_names_match_an_excluded_token_expect_those_dimensions_absolute() {
        let names = [
            "shoulder_pan.pos",
            "elbow.pos",
            "Gripper.pos",
            "left_gripper_finger",
        ];
        // Case-insensitive, substring: "gripper" excludes both gripper dimensions.
        assert_eq!(
            step(&["gripper"], Some(&names)).mask(4),
            [true, true, false, false]
        );
        // An exact, case-folded token.
        assert_eq!(
            step(&["ELBOW.POS"], Some(&names)).mask(4),
            [true, false, true, true]
        );
        // Dimensions past the names are relative; names past the width are ignored.
        assert_eq!(
            step(&["gripper"], Some(&names[..2])).mask(4),
            [true, true, true, true]
        );
        assert_eq!(step(&["gripper"], Some(&names)).mask(2), [true, true]);
    }

    #[test]
    fn when_there_are_no_names_or_no_exclusions_expect_every_dimension_relative() {
        assert_eq!(step(&["gripper"], None).mask(3), [true; 3]);
        assert_eq!(step(&[], Some(&["a", "gripper"])).mask(2), [true; 2]);
        // Empty tokens are dropped; none left means no exclusion.
        assert_eq!(step(&[""], Some(&["a", "b"])).mask(2), [true; 2]);
    }

    #[test]
    fn when_offsets_are_applied_expect_masked_dimensions_only_and_an_exact_round_trip() {
        let mask = [true, false, true];
        let state = [0.5f32, 2.0, -1.25];
        let o = Offsets {
            mask: &mask,
            state: &state,
        };
        let mut row = [0.1f32, 0.2, 0.3];
        o.to_absolute(&mut row);
        assert_eq!(row, [0.1 + 0.5, 0.2, 0.3 - 1.25]);
        o.to_relative(&mut row);
        assert_eq!(row, [0.1f32 + 0.5 - 0.5, 0.2, 0.3f32 - 1.25 + 1.25]);
    }
}
