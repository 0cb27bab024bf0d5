//! What the simulator's cameras see when it runs a task: the table from above, the arm drawn
//! as its links' projections (forward kinematics along the URDF chain), the tool as a blue
//! disc and the target as a red one as wide as the task's radius (the tool's centre inside
//! the red disc is "reached"). Edges are anti-aliased so that a position moves the
//! picture smoothly, not in whole pixels: a policy can read positions finer than a pixel.

use crate::config::sim_task::SimTask;

/// Colours (RGB).
const TABLE: [f32; 3] = [196.0, 186.0, 164.0];
const GRID: [f32; 3] = [180.0, 170.0, 150.0];
const TARGET: [f32; 3] = [215.0, 35.0, 35.0];
const ARM: [f32; 3] = [80.0, 82.0, 92.0];
const TOOL: [f32; 3] = [40.0, 90.0, 215.0];

/// Sizes on the table (m).
const GRID_SPACING_M: f64 = 0.1;
const LINK_RADIUS_M: f64 = 0.022;
const TOOL_RADIUS_M: f64 = 0.025;

/// Draws the scene of `task` into RGB8 images.
pub(crate) struct Scene {
    task: SimTask,
}

impl Scene {
    pub(crate) fn new(task: SimTask) -> Scene {
        Scene { task }
    }

    pub(crate) fn task(&self) -> &SimTask {
        &self.task
    }

    /// The tool's place on the table (m, base frame x and y) for joint positions `q`.
    pub(crate) fn tool_xy(&self, q: &[f64]) -> [f64; 2] {
        let p = self.task.workspace.chain.tool_position(q);
        [p.x, p.y]
    }

    /// Pixels per metre, and the pixel (column, row; centres at +0.5) of a table point.
    fn projection(&self, w: usize, h: usize) -> impl Fn([f64; 2]) -> (f64, f64, f64) {
        let [x0, y0] = self.task.view_min;
        let [x1, y1] = self.task.view_max;
        let (sx, sy) = (w as f64 / (y1 - y0), h as f64 / (x1 - x0));
        move |p: [f64; 2]| ((y1 - p[1]) * sx, (x1 - p[0]) * sy, sx.min(sy))
    }

    /// Renders the arm at `q` and the target at `target` (m) into `rgb` (`w` x `h`, RGB8).
    pub(crate) fn render(
        &self,
        q: &[f64],
        target: Option<[f64; 2]>,
        w: usize,
        h: usize,
        rgb: &mut [u8],
    ) {
        let mut joints = Vec::new();
        self.task.workspace.chain.joint_positions(q, &mut joints);
        let project = self.projection(w, h);
        let px_per_m = project([0.0, 0.0]).2;
        let points: Vec<(f64, f64)> = joints
            .iter()
            .map(|p| {
                let (u, v, _) = project([p.x, p.y]);
                (u, v)
            })
            .collect();
        let target = target.map(|t| {
            let (u, v, _) = project(t);
            (u, v)
        });
        let [columns, rows] = self.grid(w, h);
        let link_r = LINK_RADIUS_M * px_per_m;
        for y in 0..h {
            for x in 0..w {
                let (u, v) = (x as f64 + 0.5, y as f64 + 0.5);
                let mut c = TABLE;
                let on_grid = columns.distance(u).min(rows.distance(v));
                c = blend(c, GRID, coverage(0.5 - on_grid));
                if let Some((tu, tv)) = target {
                    let d = (u - tu).hypot(v - tv);
                    c = blend(c, TARGET, coverage(self.task.radius_m * px_per_m - d));
                }
                let d = points
                    .windows(2)
                    .map(|s| segment_distance((u, v), s[0], s[1]))
                    .fold(f64::INFINITY, f64::min);
                c = blend(c, ARM, coverage(link_r - d));
                if let Some(&(tu, tv)) = points.last() {
                    let d = (u - tu).hypot(v - tv);
                    c = blend(c, TOOL, coverage(TOOL_RADIUS_M * px_per_m - d));
                }
                let i = (y * w + x) * 3;
                for k in 0..3 {
                    rgb[i + k] = c[k].round().clamp(0.0, 255.0) as u8;
                }
            }
        }
    }

    /// The table's grid lines: per axis the view's far edge (m), pixels per metre and the
    /// range of line indices inside the view (a line every `GRID_SPACING_M`).
    fn grid(&self, w: usize, h: usize) -> [GridAxis; 2] {
        let [x0, y0] = self.task.view_min;
        let [x1, y1] = self.task.view_max;
        let axis = |lo: f64, hi: f64, px: f64| GridAxis {
            far: hi,
            scale: px / (hi - lo),
            first: (lo / GRID_SPACING_M).ceil(),
            last: (hi / GRID_SPACING_M).floor(),
        };
        [axis(y0, y1, w as f64), axis(x0, x1, h as f64)]
    }
}

/// The grid lines across one image axis.
struct GridAxis {
    far: f64,
    scale: f64,
    first: f64,
    last: f64,
}

impl GridAxis {
    /// Pixels from `p` (a column or row centre) to the nearest line inside the view: constant
    /// time, however many lines the view holds.
    fn distance(&self, p: f64) -> f64 {
        // No line inside the view (checked first: `clamp` panics on an empty range).
        if self.first > self.last {
            return f64::INFINITY;
        }
        let at = self.far - p / self.scale;
        let k = (at / GRID_SPACING_M).round().clamp(self.first, self.last);
        (p - (self.far - k * GRID_SPACING_M) * self.scale).abs()
    }
}

/// The share of a pixel inside an edge `inside` pixels away (negative: outside).
fn coverage(inside: f64) -> f32 {
    (inside + 0.5).clamp(0.0, 1.0) as f32
}

fn blend(under: [f32; 3], over: [f32; 3], alpha: f32) -> [f32; 3] {
    [0, 1, 2].map(|k| under[k] + (over[k] - under[k]) * alpha)
}

fn segment_distance(p: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    let t = if len2 > 0.0 {
        (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0)
    } else {
        0.0
    };
    (p.0 - a.0 - t * dx).hypot(p.1 - a.1 - t * dy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::demo_task;

    const W: usize = 128;

    fn pixel(rgb: &[u8], u: f64, v: f64) -> [u8; 3] {
        let i = (v as usize * W + u as usize) * 3;
        [rgb[i], rgb[i + 1], rgb[i + 2]]
    }

    /// The centroid (column, row) of pixels closer to `color` than to any other scene colour.
    fn centroid(rgb: &[u8], color: [f32; 3]) -> (f64, f64, usize) {
        let (mut su, mut sv, mut n) = (0.0, 0.0, 0usize);
        for k in 0..W * W {
            let p = [rgb[3 * k], rgb[3 * k + 1], rgb[3 * k + 2]].map(f32::from);
            if (0..3).all(|c| (p[c] - color[c]).abs() < 2.0) {
                su += (k % W) as f64 + 0.5;
                sv += (k / W) as f64 + 0.5;
                n += 1;
            }
        }
        (su / n as f64, sv / n as f64, n)
    }

    #[test]
    fn when_drawn_expect_the_tool_and_the_target_where_the_kinematics_and_the_view_put_them() {
        let task = demo_task();
        let scene = Scene::new(task.clone());
        let q = [0.5, 0.4, 0.8, -0.4, 0.0, 0.0, 0.02];
        let target = [0.3, -0.2];
        let mut rgb = vec![0u8; W * W * 3];
        scene.render(&q, Some(target), W, W, &mut rgb);
        let project = scene.projection(W, W);
        // The view: 1 m across 128 px, x up the image, y to the left.
        let (tu, tv, ppm) = project(target);
        assert_eq!(ppm, 128.0);
        assert!(
            (tu - (0.5 + 0.2) * 128.0).abs() < 1e-9 && (tv - (0.75 - 0.3) * 128.0).abs() < 1e-9
        );
        let (cu, cv, n) = centroid(&rgb, TARGET);
        assert!(
            n > 20 && (cu - tu).abs() < 0.3 && (cv - tv).abs() < 0.3,
            "target at ({cu}, {cv}), {n} px"
        );
        let (bu, bv, _) = project(scene.tool_xy(&q));
        let (cu, cv, n) = centroid(&rgb, TOOL);
        assert!(
            n > 10 && (cu - bu).abs() < 0.5 && (cv - bv).abs() < 0.5,
            "tool at ({cu}, {cv}) not ({bu}, {bv})"
        );
        // Far from both: the table.
        let far = pixel(&rgb, 2.0, 2.0);
        assert!(
            far == TABLE.map(|c| c as u8) || far == GRID.map(|c| c as u8),
            "{far:?}"
        );
    }

    #[test]
    fn when_the_arm_moves_less_than_a_pixel_expect_the_picture_to_change() {
        let scene = Scene::new(demo_task());
        let (mut a, mut b) = (vec![0u8; W * W * 3], vec![0u8; W * W * 3]);
        let q = [0.2, 0.4, 0.8, -0.4, 0.0, 0.0, 0.02];
        scene.render(&q, None, W, W, &mut a);
        let mut moved = q;
        moved[0] += 0.005; // about 2 mm at the tool: a quarter of a pixel
        scene.render(&moved, None, W, W, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn when_the_view_holds_no_grid_line_expect_the_table_drawn_without_one() {
        let mut task = demo_task();
        // Narrower than the grid's spacing on both axes, between two lines.
        task.view_min = [0.31, 0.11];
        task.view_max = [0.39, 0.19];
        let scene = Scene::new(task);
        let mut rgb = vec![0u8; W * W * 3];
        scene.render(&[0.0; 7], None, W, W, &mut rgb);
        assert_eq!(centroid(&rgb, GRID).2, 0);
        assert!(centroid(&rgb, TABLE).2 > 0);
    }
}
