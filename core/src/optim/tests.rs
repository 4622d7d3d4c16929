use super::*;

/// One parameter's window value and state, updated by pushes as the engine does: read, step,
/// accumulate.
struct Cell {
    w: f32,
    st: Vec<f32>,
}

impl Cell {
    fn new(o: &Optimizer) -> Self {
        Self { w: 0.5, st: vec![0.0; o.slots()] }
    }

    /// Pushes of (share, contribution) landing one after another, all having read the state
    /// before the first landed (one iteration's pushes under BSP).
    fn iteration(&mut self, o: &Optimizer, lr: f32, t: u64, pushes: &[(f32, f32)]) {
        let (w0, st0) = (self.w, self.st.clone());
        for &(share, c) in pushes {
            let mut c = [c];
            let mut ds = vec![0.0; o.slots()];
            let mut w = [w0];
            o.weights(lr, 0, &(0..0), &mut w, &st0);
            o.step(Step { lr, share, t }, &mut c, &st0, &mut ds, &w);
            self.w += c[0];
            self.st.iter_mut().zip(&ds).for_each(|(s, d)| *s += d);
        }
    }

    /// The weight as a read sees it.
    fn weight(&self, o: &Optimizer, lr: f32) -> f32 {
        let mut w = [self.w];
        o.weights(lr, 0, &(0..0), &mut w, &self.st);
        w[0]
    }
}

/// The textbook rules, one parameter, gradient `g` at step `t`.
fn reference(o: &Optimizer, lr: f32, gs: &[f32]) -> f32 {
    let (mut w, mut a, mut b) = (0.5f32, 0.0f32, 0.0f32);
    for (i, &g) in gs.iter().enumerate() {
        let t = (i + 1) as i32;
        match *o {
            Optimizer::Sgd => w -= lr * g,
            Optimizer::Momentum { mu, nesterov } => {
                a = mu * a + g;
                w -= lr * if nesterov { g + mu * a } else { a };
            }
            Optimizer::AdaGrad { eps } => {
                a += g * g;
                w -= lr * g / (a.sqrt() + eps);
            }
            Optimizer::Adam { beta1, beta2, eps } => {
                a = beta1 * a + (1.0 - beta1) * g;
                b = beta2 * b + (1.0 - beta2) * g * g;
                let (m, v) = (a / (1.0 - beta1.powi(t)), b / (1.0 - beta2.powi(t)));
                w -= lr * m / (v.sqrt() + eps);
            }
            Optimizer::Ftrl { beta, l1 } => {
                // McMahan et al. (2013), Algorithm 1, one coordinate (lambda2 = 0), from z = 0.
                let wt = if a.abs() <= l1 { 0.0 } else { -(a - a.signum() * l1) / ((beta + b.sqrt()) / lr) };
                let sigma = ((b + g * g).sqrt() - b.sqrt()) / lr;
                a += g - sigma * wt;
                b += g * g;
                w = if a.abs() <= l1 { 0.0 } else { -(a - a.signum() * l1) / ((beta + b.sqrt()) / lr) };
            }
        }
    }
    w
}

fn all() -> Vec<Optimizer> {
    ["sgd", "momentum", "nesterov:0.5", "adagrad", "adam", "ftrl"]
        .iter()
        .map(|s| s.parse().expect("parses"))
        .chain([Optimizer::Ftrl { beta: 1.0, l1: 0.3 }])
        .collect()
}

const GRADS: [f32; 8] = [0.8, -0.3, 1.5, 0.2, -2.0, 0.05, 0.7, -0.9];

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn one_push_of_share_one_is_the_textbook_rule() {
    for o in all() {
        let mut cell = Cell::new(&o);
        if o.derived() {
            cell.w = 0.0;
        }
        for (i, &g) in GRADS.iter().enumerate() {
            cell.iteration(&o, 0.1, i as u64 + 1, &[(1.0, g)]);
            let want = reference(&o, 0.1, &GRADS[..=i]);
            let got = cell.weight(&o, 0.1);
            assert!(close(got, want), "{o}: step {} weight {got}, textbook {want}", i + 1);
        }
    }
}

#[test]
fn pushes_of_equal_gradients_add_up_to_one_step() {
    // Three ranks with shares 0.5, 0.3, 0.2 and the same mean gradient: the iteration's pushes
    // land as one step of the whole batch (the squares too, since the gradients agree).
    for o in all() {
        let (mut one, mut three) = (Cell::new(&o), Cell::new(&o));
        for (i, &g) in GRADS.iter().enumerate() {
            let t = i as u64 + 1;
            one.iteration(&o, 0.05, t, &[(1.0, g)]);
            three.iteration(&o, 0.05, t, &[(0.5, 0.5 * g), (0.3, 0.3 * g), (0.2, 0.2 * g)]);
            let (a, b) = (one.weight(&o, 0.05), three.weight(&o, 0.05));
            assert!(close(a, b), "{o}: step {t}: one push {a}, three {b}");
            for (x, y) in one.st.iter().zip(&three.st) {
                assert!(close(*x, *y), "{o}: step {t}: state {x} against {y}");
            }
        }
    }
}

#[test]
fn a_momentum_contribution_is_linear_in_the_share() {
    // Different gradients: momentum's pushes add up to the textbook step on the mean gradient.
    let o: Optimizer = "momentum".parse().expect("parses");
    let (mut one, mut two) = (Cell::new(&o), Cell::new(&o));
    for (i, w) in GRADS.windows(2).enumerate() {
        let t = i as u64 + 1;
        one.iteration(&o, 0.1, t, &[(1.0, 0.5 * (w[0] + w[1]))]);
        two.iteration(&o, 0.1, t, &[(0.5, 0.5 * w[0]), (0.5, 0.5 * w[1])]);
        assert!(close(one.w, two.w) && close(one.st[0], two.st[0]), "step {t}");
    }
}

#[test]
fn ftrl_weight_is_the_proximal_minimizer() {
    // w = argmin z w + l1 |w| + (beta + sqrt n) / (2 a) w^2, found by a fine grid.
    for &(z, n, l1) in &[(0.7f32, 4.0f32, 0.3f32), (-2.0, 0.5, 0.3), (0.2, 1.0, 0.3), (-1.0, 9.0, 0.0)] {
        let (a, beta) = (0.4, 1.0);
        let f = |w: f32| z * w + l1 * w.abs() + (beta + n.sqrt()) / (2.0 * a) * w * w;
        let best =
            (-40000..=40000).map(|i| i as f32 * 1e-4).min_by(|x, y| f(*x).total_cmp(&f(*y))).expect("parses");
        let got = ftrl_weight(z, n, a, beta, l1);
        assert!((got - best).abs() <= 2e-4, "z {z} n {n}: {got} against {best}");
    }
    assert_eq!(ftrl_weight(0.29, 3.0, 0.1, 1.0, 0.3), 0.0, "inside the L1 ball: an exact zero");
}

#[test]
fn ftrl_keeps_exact_zeros_under_interleaved_pushes() {
    // Small, conflicting gradients of two ranks: |z| stays inside the ball and every read is 0.0
    // exactly, whatever order the pushes land in.
    let o = Optimizer::Ftrl { beta: 1.0, l1: 1.0 };
    let mut cell = Cell { w: 0.0, st: vec![0.0] };
    for t in 1..50 {
        let pushes = if t % 2 == 0 { [(0.5, 0.04), (0.5, -0.05)] } else { [(0.5, -0.05), (0.5, 0.04)] };
        cell.iteration(&o, 0.1, t, &pushes);
        assert_eq!(cell.weight(&o, 0.1), 0.0, "step {t}");
    }
    // An exempt parameter (an intercept) gets no L1: the same pushes move it.
    let mut w = [cell.w];
    o.weights(0.1, 0, &(0..1), &mut w, &cell.st);
    assert_ne!(w[0], 0.0);
}

#[test]
fn stored_reads_back_as_the_initial_weight() {
    let o = Optimizer::Ftrl { beta: 1.0, l1: 0.3 };
    for w in [0.25f32, -1.5, 0.0] {
        for exempt in [false, true] {
            let mut z = [o.stored(0.2, exempt, w)];
            o.weights(0.2, 0, if exempt { &(0..1) } else { &(0..0) }, &mut z, &[0.0]);
            assert!(close(z[0], w), "{w} exempt {exempt}: reads {}", z[0]);
        }
    }
    assert_eq!(Optimizer::Sgd.stored(0.2, false, 0.7), 0.7);
}

#[test]
fn names_parse_and_print_back() {
    for s in ["sgd", "momentum", "momentum:0.5", "nesterov", "adagrad", "adam", "adam:0.8,0.99", "ftrl"] {
        let o: Optimizer = s.parse().expect("parses");
        assert_eq!(o.to_string(), s);
    }
    assert_eq!("momentum:0.9".parse::<Optimizer>().expect("parses").to_string(), "momentum");
    for bad in ["sgd:1", "momentum:1", "momentum:x", "adam:0.9", "adagrad:2", "rmsprop", ""] {
        let e = bad.parse::<Optimizer>().expect_err("an error");
        assert!(e.contains("optimizer"), "{bad}: {e}");
    }
}

#[test]
fn schedules() {
    let s = Schedule::default();
    assert!(s.constant());
    assert_eq!(s.factor(1000, 10, 2000), 1.0);
    let inv = Schedule { warmup: 0, decay: Decay::Inverse(1.0) };
    assert_eq!(inv.factor(20, 10, 100), 1.0 / 3.0);
    let warm = Schedule { warmup: 4, decay: Decay::Inverse(0.0) };
    let f: Vec<f64> = (0..6).map(|i| warm.factor(i, 10, 100)).collect();
    assert_eq!(f, [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]);
    let cos = Schedule { warmup: 10, decay: Decay::Cosine };
    assert_eq!(cos.factor(10, 5, 110), 1.0);
    assert!((cos.factor(60, 5, 110) - 0.5).abs() < 1e-12);
    assert!(cos.factor(109, 5, 110) < 0.001);
    assert!(cos.factor(5, 5, 110) < 1.0, "warming up");
}

#[test]
fn a_step_in_place_is_the_step_and_its_adds_bit_for_bit() {
    // Over several blocks and a short last one, with state and gradients that vary, from 0 to 3
    // contributions (the other ranks' slots) and with or without the owner's own; contributions
    // already scaled (1) or sums over rows (a scale); with and without an L2 penalty on ranges
    // that cross blocks.
    let n = 600;
    let ranges = [10..300, 400..590];
    for o in all().into_iter().filter(|o| !o.derived()) {
        let k = o.slots();
        let w0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let st0: Vec<f32> = (0..n * k).map(|i| 0.1 + (i as f32 * 0.11).cos().abs()).collect();
        let parts: Vec<f32> = (0..3 * n).map(|i| (i as f32 * 0.73).cos() * 0.3).collect();
        let own: Vec<f32> = (0..n).map(|i| (i as f32 * 0.19).sin() * 0.2).collect();
        let p = Step { lr: 0.05, share: 1.0, t: 7 };
        let shapes = [0, 1, 3].into_iter().flat_map(|np| [(np, None), (np, Some(&own[..]))]);
        let ways = [(1.0, None), (0.125, None), (0.125, Some((0.3, &ranges[..])))];
        for ((np, own), (scale, decay)) in shapes.flat_map(|s| ways.iter().map(move |&w| (s, w))) {
            let parts = &parts[..np * n];
            // The owner-side step as it was: step on a copy of the sum (the parts in their
            // order, then the own part, then scaled, then the penalty's gradient), then add
            // both updates.
            let mut c = vec![0.0f32; n];
            for part in parts.chunks_exact(n).chain(own) {
                for (c, g) in c.iter_mut().zip(part) {
                    *c += *g;
                }
            }
            if scale != 1.0 {
                c.iter_mut().for_each(|c| *c *= scale);
            }
            if let Some((l2, ranges)) = decay {
                for j in ranges.iter().flat_map(Clone::clone) {
                    c[j] += l2 * w0[j];
                }
            }
            let mut ds = vec![0.0; n * k];
            o.step(p, &mut c, &st0, &mut ds, &[]);
            let w1: Vec<f32> = w0.iter().zip(&c).map(|(w, c)| w + c).collect();
            let st1: Vec<f32> = st0.iter().zip(&ds).map(|(s, d)| s + d).collect();
            let (mut w, mut st) = (w0.clone(), st0.clone());
            o.step_in_place(p, &mut w, &mut st, &Gradient { parts, own, scale, decay });
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let name = (o.name(), np, own.is_some(), scale, decay.is_some());
            assert_eq!(bits(&w), bits(&w1), "{name:?}: weights");
            assert_eq!(bits(&st), bits(&st1), "{name:?}: state");
            if np > 0 || own.is_some() || decay.is_some() {
                assert_ne!(bits(&w), bits(&w0), "{name:?}: the weights moved");
            }
        }
    }
}
