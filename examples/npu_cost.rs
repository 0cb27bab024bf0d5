//! Prints the cost model of the exported pi0 graphs (docs/ascend.md's tables, the README's
//! hardware estimates):
//! `cargo run --release --example npu_cost`.

fn main() {
    print!("{}", pi0d::policy::export::cost::report());
}
