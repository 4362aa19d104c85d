//! The power-loss simulator: persisted lines survive `crash()`, everything else is thrown away,
//! and a simulated file holds exactly the persisted lines at every moment.

mod common;

use common::{TempDir, pattern};
use pmem::{CACHE_LINE, Durability, Kind, MapOptions, Mapping};

fn sim_anon(len: usize) -> Mapping {
    MapOptions::new()
        .simulate_power_loss(true)
        .anonymous(len)
        .unwrap()
}

fn sim_file(dir: &TempDir, len: usize) -> Mapping {
    MapOptions::new()
        .simulate_power_loss(true)
        .create_file(&dir.path().join("region"), len)
        .unwrap()
}

fn bytes(m: &Mapping, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    m.read(offset, &mut out).unwrap();
    out
}

/// Write A, persist A, write B, crash: A is there, B's lines read as before B.
fn crash_keeps_only_what_was_persisted(m: &Mapping) {
    let a = pattern(0xA0, 256);
    let b = pattern(0xB0, 200);
    m.write(0, &a).unwrap();
    m.persist(0, 256).unwrap();
    m.write(1024, &b).unwrap();
    assert!(m.is_persisted(0, 256));
    assert!(!m.is_persisted(1024, 200));
    assert!(!m.is_persisted(0, m.len()));

    m.crash().unwrap();
    assert_eq!(bytes(m, 0, 256), a);
    assert_eq!(
        bytes(m, 1024, 200),
        vec![0u8; 200],
        "unpersisted B survived the crash"
    );
    assert!(m.is_persisted(0, m.len()));

    // A persisted line that is overwritten and not persisted again reverts to its persisted
    // value, not to zero.
    m.write(0, &[0xFF; 64]).unwrap();
    assert!(!m.is_persisted(0, 1));
    m.crash().unwrap();
    assert_eq!(bytes(m, 0, 256), a);

    // The mapping works as before after a crash.
    m.write(1024, &b).unwrap();
    m.persist(1024, 200).unwrap();
    m.crash().unwrap();
    assert_eq!(bytes(m, 1024, 200), b);
}

#[test]
fn crash_keeps_only_persisted_lines_anonymous() {
    let m = sim_anon(3 * 4096);
    assert_eq!(m.kind(), Kind::SimulatedAnonymous);
    crash_keeps_only_what_was_persisted(&m);
}

#[test]
fn crash_keeps_only_persisted_lines_file() {
    let dir = TempDir::new("sim-crash");
    let m = sim_file(&dir, 3 * 4096);
    assert_eq!(m.kind(), Kind::SimulatedFile);
    crash_keeps_only_what_was_persisted(&m);
}

#[test]
fn the_simulated_file_holds_exactly_the_persisted_lines() {
    let dir = TempDir::new("sim-file-image");
    let m = sim_file(&dir, 2 * 4096);
    m.write(0, &[1; 128]).unwrap();
    m.write(4096, &[2; 64]).unwrap();
    m.persist(0, 64).unwrap();
    let file = std::fs::read(dir.path().join("region")).unwrap();
    assert_eq!(&file[..64], &[1; 64]);
    assert_eq!(
        &file[64..128],
        &[0; 64],
        "an unpersisted line reached the file"
    );
    assert_eq!(
        &file[4096..4160],
        &[0; 64],
        "an unpersisted line reached the file"
    );
}

#[test]
fn open_file_under_the_simulator_starts_from_the_file() {
    let dir = TempDir::new("sim-open");
    let path = dir.path().join("region");
    std::fs::write(&path, pattern(3, 5000)).unwrap();
    let m = MapOptions::new()
        .simulate_power_loss(true)
        .open_file(&path)
        .unwrap();
    assert_eq!(m.len(), 5000);
    assert_eq!(bytes(&m, 0, 5000), pattern(3, 5000));
    assert!(m.is_persisted(0, 5000));
    m.fill(0, 5000, 0).unwrap();
    m.persist(4990, 10).unwrap(); // the last, short line: [4928, 5000)
    m.crash().unwrap();
    let mut want = pattern(3, 5000);
    want[4928..].fill(0);
    assert_eq!(bytes(&m, 0, 5000), want);
    assert_eq!(std::fs::read(&path).unwrap(), want);
}

fn partial_lines(m: &Mapping) {
    m.write(64, &[7; 64]).unwrap(); // line 1
    m.write(128, &[8; 64]).unwrap(); // line 2
    m.write(192, &[9; 64]).unwrap(); // line 3
    m.persist(100, 1).unwrap(); // one byte: all of line 1
    assert!(m.is_persisted(64, 64));
    assert!(!m.is_persisted(127, 2), "line 2 is not persisted yet");
    m.persist(191, 2).unwrap(); // two bytes across a boundary: lines 2 and 3
    m.write(256, &[10; 64]).unwrap(); // line 4, never persisted
    m.crash().unwrap();
    assert_eq!(bytes(m, 64, 192), [[7u8; 64], [8; 64], [9; 64]].concat());
    assert_eq!(bytes(m, 256, 64), [0u8; 64]);
}

#[test]
fn persisting_a_byte_persists_its_whole_line() {
    partial_lines(&sim_anon(4096));
    let dir = TempDir::new("sim-partial");
    partial_lines(&sim_file(&dir, 4096));
}

fn ranges(m: &Mapping) {
    // Five written spots; persist three of them (unsorted, one overlapping another, one
    // touching), leave two unpersisted.
    let spots = [
        (0usize, 10usize),
        (700, 300),
        (900, 200),
        (1100, 64),
        (8000, 100),
    ];
    for (i, &(o, n)) in spots.iter().enumerate() {
        m.write(o, &pattern(i as u8 + 1, n)).unwrap();
    }
    let mut image = vec![0u8; m.len()];
    for (i, &(o, n)) in spots.iter().enumerate() {
        image[o..o + n].copy_from_slice(&pattern(i as u8 + 1, n));
    }
    m.persist_ranges(&[(900, 200), (700, 300), (1100, 64)])
        .unwrap();
    m.persist_ranges(&[]).unwrap();
    m.crash().unwrap();
    // Persisted: whole lines [640, 1216). Lost: [0, 64) and [7936, 8128).
    image[..64].fill(0);
    image[7936..8128].fill(0);
    assert_eq!(bytes(m, 0, m.len()), image);
    assert!(m.is_persisted(0, m.len()));
}

#[test]
fn persist_ranges_persists_every_range_and_nothing_else() {
    ranges(&sim_anon(3 * 4096));
    let dir = TempDir::new("sim-ranges");
    ranges(&sim_file(&dir, 3 * 4096));
}

#[test]
fn persist_runs_on_another_thread_while_other_lines_are_written() {
    const HALF: usize = 64 * 1024;
    let m = sim_anon(2 * HALF);
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..20u8 {
                for line in (0..HALF).step_by(CACHE_LINE) {
                    m.fill(line, CACHE_LINE, round).unwrap();
                }
            }
        });
        s.spawn(|| {
            for line in (HALF..2 * HALF).step_by(CACHE_LINE) {
                m.write(line, &pattern(line as u8, CACHE_LINE)).unwrap();
                m.persist(line + 5, 1).unwrap();
            }
        });
    });
    m.crash().unwrap();
    for line in (HALF..2 * HALF).step_by(CACHE_LINE) {
        assert_eq!(
            bytes(&m, line, CACHE_LINE),
            pattern(line as u8, CACHE_LINE),
            "line at {line}"
        );
    }
    assert_eq!(
        bytes(&m, 0, HALF),
        vec![0u8; HALF],
        "the other thread's stores were never persisted"
    );
}

#[test]
fn simulated_mappings_say_what_they_are() {
    let m = sim_anon(64);
    assert!(!m.is_dax());
    assert_eq!(m.durability(), Durability::Simulated);
    assert!(
        m.kind().to_string().contains("power-loss simulator"),
        "{}",
        m.kind()
    );
    let dir = TempDir::new("sim-kind");
    let f = sim_file(&dir, 64);
    assert!(!f.is_dax());
    assert_eq!(f.durability(), Durability::Simulated);
    assert!(
        f.kind()
            .to_string()
            .starts_with("file under the power-loss simulator"),
        "{}",
        f.kind()
    );
}
