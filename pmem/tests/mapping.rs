//! Real mappings on this machine: round trips on every kind that works here, hugetlb against
//! /proc/meminfo, file create/open, the DAX attempt, and persist seen through std::fs.

mod common;

use std::path::Path;

use common::{TempDir, meminfo_free_2mib_pages, mount_options, pattern};
use pmem::{Durability, Error, HUGE_PAGE, Kind, MapOptions, Mapping};

/// Writes patterns at awkward offsets and reads them back, then checks the bytes around them.
fn round_trip(m: &Mapping) {
    let len = m.len();
    let spots = [
        (0, 1),
        (1, 63),
        (63, 2),
        (4095, 3),
        (len / 2, 1000.min(len / 2)),
        (len - 7, 7),
    ];
    for (i, &(offset, n)) in spots.iter().enumerate() {
        let data = pattern(i as u8 * 31, n);
        m.write(offset, &data).unwrap();
        let mut back = vec![0u8; n];
        m.read(offset, &mut back).unwrap();
        assert_eq!(back, data, "{} at {offset}+{n}", m.kind());
    }
    m.fill(100, 50, 0xEE).unwrap();
    let mut back = [0u8; 52];
    m.read(99, &mut back).unwrap();
    assert_eq!(back[0], 0);
    assert!(back[1..51].iter().all(|&b| b == 0xEE));
    assert_eq!(back[51], 0);
}

#[test]
fn round_trips_on_every_kind_that_maps_here() {
    let dir = TempDir::new("round-trip");
    let mut maps = vec![
        Mapping::anonymous(3 * 4096 + 5).unwrap(),
        Mapping::anonymous_prefer_huge(HUGE_PAGE + 1).unwrap(),
        Mapping::create_file(&dir.path().join("plain"), 5 * 4096).unwrap(),
        MapOptions::new()
            .simulate_power_loss(true)
            .anonymous(8192)
            .unwrap(),
        MapOptions::new()
            .simulate_power_loss(true)
            .create_file(&dir.path().join("sim"), 8192)
            .unwrap(),
    ];
    if let Ok(huge) = Mapping::hugetlb(1) {
        maps.push(huge);
    }
    for m in &maps {
        round_trip(m);
        m.persist(0, m.len()).unwrap();
    }
}

#[test]
fn hugetlb_does_what_meminfo_allows() {
    let free = meminfo_free_2mib_pages();
    let want = 3 << 20; // rounds up to two 2 MiB pages
    let direct = Mapping::hugetlb(want);
    match (&direct, free) {
        (Ok(m), _) => {
            assert_eq!(m.kind(), Kind::HugeTlb);
            assert_eq!(m.len(), 2 * HUGE_PAGE);
            assert_eq!(m.durability(), Durability::Volatile);
            assert_eq!(
                m.as_ptr() as usize % HUGE_PAGE,
                0,
                "hugetlb memory is 2 MiB aligned"
            );
            assert!(
                free.is_none_or(|n| n >= 2),
                "mapped 2 hugetlb pages while meminfo said {free:?} free"
            );
            round_trip(m);
        }
        (Err(e), Some(n)) if n < 2 => {
            let text = e.to_string();
            assert!(matches!(e, Error::HugeTlb { .. }), "{e:?}");
            assert!(text.contains(&format!("{n} free 2 MiB pages")), "{text}");
            assert!(
                text.contains("nr_hugepages"),
                "the message says how to reserve pages: {text}"
            );
        }
        // Enough pages free but refused (a cgroup limit, say): nothing more to check here.
        (Err(_), _) => {}
    }
    let hugetlb_worked = direct.is_ok();
    drop(direct);

    let preferred = Mapping::anonymous_prefer_huge(want).unwrap();
    match preferred.kind() {
        Kind::HugeTlb => {
            assert!(
                free.is_some_and(|n| n >= 2),
                "hugetlb chosen with {free:?} pages free"
            );
            assert_eq!(preferred.len(), 2 * HUGE_PAGE);
        }
        Kind::Anonymous => {
            assert!(
                !hugetlb_worked || free.is_some_and(|n| n < 2),
                "fell back although hugetlb worked"
            );
            assert_eq!(preferred.len(), want, "anonymous memory is not rounded");
        }
        other => panic!("anonymous_prefer_huge made {other}"),
    }
    eprintln!(
        "hugetlb: {free:?} free 2 MiB pages, prefer_huge chose {}",
        preferred.kind()
    );
}

#[test]
fn create_then_open_round_trips_through_the_file() {
    let dir = TempDir::new("create-open");
    let path = dir.path().join("region");
    let first = pattern(1, 10_000);
    {
        let m = Mapping::create_file(&path, 10_000).unwrap();
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.path(), Some(path.as_path()));
        m.write(0, &first).unwrap();
        m.persist(0, 10_000).unwrap();
    }
    assert_eq!(std::fs::read(&path).unwrap(), first);

    let m = Mapping::open_file(&path).unwrap();
    assert_eq!(m.len(), 10_000);
    let mut back = vec![0u8; 10_000];
    m.read(0, &mut back).unwrap();
    assert_eq!(back, first);

    // create_file truncates: the old content is gone.
    drop(m);
    let m = Mapping::create_file(&path, 4096).unwrap();
    let mut back = vec![1u8; 4096];
    m.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096);
}

#[test]
fn persisted_bytes_are_in_the_file() {
    let dir = TempDir::new("persist-file");
    let path = dir.path().join("region");
    let m = Mapping::create_file(&path, 3 * 4096).unwrap();
    m.write(10, b"first").unwrap();
    m.write(4096 + 4000, &pattern(9, 200)).unwrap(); // crosses into the third page
    m.persist(10, 5).unwrap();
    m.persist_ranges(&[(4096 + 4000, 200), (0, 1), (4096, 1)])
        .unwrap();
    let file = std::fs::read(&path).unwrap();
    assert_eq!(&file[10..15], b"first");
    assert_eq!(&file[4096 + 4000..4096 + 4200], pattern(9, 200).as_slice());
}

#[test]
fn file_errors_name_the_path() {
    let dir = TempDir::new("errors");
    let missing = dir.path().join("no-such-file");
    let e = Mapping::open_file(&missing).unwrap_err();
    assert!(matches!(e, Error::Io { action: "open", .. }), "{e:?}");
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );

    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let e = Mapping::open_file(&empty).unwrap_err();
    assert!(matches!(e, Error::EmptyFile { .. }), "{e:?}");
    assert!(e.to_string().contains("empty"), "{e}");

    let e = Mapping::create_file(&dir.path().join("no-dir/region"), 64).unwrap_err();
    assert!(e.to_string().contains("no-dir/region"), "{e}");
}

/// Asserts that a file mapping on a file system without DAX says so.
fn assert_not_dax(dir: &Path) {
    let path = dir.join(format!("pmem-dax-probe-{}", std::process::id()));
    let m = Mapping::create_file(&path, 4096);
    let _ = std::fs::remove_file(&path);
    let m = m.unwrap();
    assert!(!m.is_dax(), "{} reported DAX", dir.display());
    assert_eq!(m.kind(), Kind::File { dax: false });
    assert_eq!(m.durability(), Durability::Msync);
    assert_eq!(
        m.kind().to_string(),
        "file (not DAX: the file system refused MAP_SYNC; persist = msync)"
    );
}

#[test]
fn map_sync_is_refused_without_dax() {
    let tmp = std::env::temp_dir();
    let opts = mount_options(&tmp);
    if opts.split(',').any(|o| o == "dax" || o.starts_with("dax=")) {
        eprintln!("{} is mounted with {opts}: not asserting", tmp.display());
    } else {
        assert_not_dax(&tmp);
    }
    // tmpfs never offers DAX.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        assert_not_dax(shm);
    }
}

#[test]
fn borrowed_memory_is_read_and_written_in_place_and_left_mapped() {
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` outlives the mapping and nothing else touches it meanwhile.
    let map = unsafe { Mapping::borrowed(buf.as_mut_ptr(), buf.len()) }.unwrap();
    assert_eq!(
        map.as_ptr(),
        buf.as_ptr(),
        "registered in place, not copied"
    );
    assert_eq!(map.kind(), pmem::Kind::Application);
    map.write(100, b"portico").unwrap();
    assert!(
        map.write(4095, b"xx").is_err(),
        "bounds are the borrowed range's"
    );
    map.persist(0, 4096).unwrap();
    drop(map);
    // Dropping the mapping left the application's memory mapped and as written.
    assert_eq!(&buf[100..107], b"portico");
    // SAFETY: refused before anything is dereferenced.
    assert!(unsafe { Mapping::borrowed(std::ptr::null_mut(), 8) }.is_err());
    assert!(unsafe { Mapping::borrowed(buf.as_mut_ptr(), 0) }.is_err());
}

#[test]
fn a_borrowed_file_mapping_persists_by_msync_from_inside_a_page() {
    let path = std::env::temp_dir().join(format!("pmem-borrowed-file-{}", std::process::id()));
    // The application's own shared mapping of the file (here made through pmem, used raw).
    let owner = Mapping::create_file(&path, 3 * 4096).unwrap();
    let base = owner.as_ptr() as *mut u8;
    // SAFETY: `owner` keeps the range mapped (shared, of `path`) for the whole test.
    let map =
        unsafe { Mapping::borrowed_file(base.wrapping_add(100), 8192, path.clone()) }.unwrap();
    assert_eq!(map.kind(), pmem::Kind::ApplicationFile);
    assert_eq!(map.durability(), pmem::Durability::Msync);
    assert_eq!(map.path(), Some(path.as_path()));
    map.write(0, b"durable").unwrap();
    // A range that starts 100 bytes into a page: msync takes the whole page.
    map.persist(0, 8192).unwrap();
    drop(map);
    let mut back = [0u8; 7];
    owner.read(100, &mut back).unwrap();
    assert_eq!(&back, b"durable");
    let file = std::fs::read(&path).unwrap();
    assert_eq!(&file[100..107], b"durable");
    drop(owner);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn an_emulated_pmem_file_persists_by_line_write_back_and_says_it_is_not_durable() {
    let dir = TempDir::new("emulated-pmem");
    let path = dir.path().join("pool");
    let m = MapOptions::new()
        .emulate_pmem(true)
        .create_file(&path, 8192)
        .unwrap();
    if m.is_dax() {
        eprintln!(
            "{} is on a real DAX file system: not asserting",
            path.display()
        );
        return;
    }
    assert_eq!(m.kind(), Kind::EmulatedPmem);
    if cfg!(target_arch = "x86_64") {
        assert!(
            matches!(m.durability(), Durability::CacheFlush(_)),
            "{:?}",
            m.durability()
        );
    }
    let words = m.kind().to_string();
    assert!(words.contains("emulated, not durable"), "{words}");
    m.write(100, b"emulated").unwrap();
    m.persist(96, 64).unwrap();
    let mut back = [0u8; 8];
    m.read(100, &mut back).unwrap();
    assert_eq!(&back, b"emulated");
    // With the power-loss simulator: refused, naming both options.
    let e = MapOptions::new()
        .emulate_pmem(true)
        .simulate_power_loss(true)
        .create_file(&dir.path().join("other"), 4096)
        .unwrap_err();
    assert!(matches!(e, Error::Options(_)), "{e}");
    assert!(e.to_string().contains("emulate_pmem"), "{e}");
    // Anonymous memory is not affected.
    let a = MapOptions::new()
        .emulate_pmem(true)
        .anonymous(4096)
        .unwrap();
    assert_eq!(a.kind(), Kind::Anonymous);
}
