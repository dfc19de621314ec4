//! The real stack for image garbage collection (issue 14), proved: containerd's root on a small
//! tmpfs that CRI ImageFsInfo names, images of known sizes that take known space, containers
//! that run under runc (and one created but not started), and a stop that leaves nothing behind.

mod support;

use std::path::{Path, PathBuf};

use support::stack::{LocalStack, StackOptions, alive, mounts_below, statfs};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A stack whose containerd root is a tmpfs of `mib` MiB.
fn small_stack(mib: u64) -> Option<LocalStack> {
    LocalStack::start_with(StackOptions::default().image_fs_mib(mib))
}

/// The stack's cgroup directories in every hierarchy (cgroup v1: one per controller).
fn cgroup_dirs(parent: &str) -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
    roots.extend(std::fs::read_dir("/sys/fs/cgroup").expect("/sys/fs/cgroup").flatten().map(|entry| entry.path()));
    roots.iter().map(|root| root.join(parent.trim_start_matches('/'))).filter(|dir| dir.is_dir()).collect()
}

fn fs_type(path: &Path) -> String {
    let output = std::process::Command::new("stat").args(["-f", "-c", "%T"]).arg(path).output().expect("stat runs");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn image_fs_info_names_a_directory_on_the_small_tmpfs_of_the_size_asked() {
    let Some(stack) = small_stack(32) else { return };
    let image_fs = stack.image_fs.clone().expect("started with a tmpfs");
    assert!(stack.mounts().contains(&image_fs), "{} is a mount point: {:?}", image_fs.display(), stack.mounts());

    let info = stack.image_fs_info();
    assert!(info.mountpoint.starts_with(&image_fs), "ImageFsInfo names {info:?}, not a directory on {image_fs:?}");
    assert_eq!(fs_type(&info.mountpoint), "tmpfs");
    let (capacity, available) = statfs(&info.mountpoint);
    assert_eq!(capacity, 32 * MIB, "statfs of ImageFsInfo's mount point gives the size asked");
    assert!(available > 31 * MIB, "an empty containerd takes little: {available} bytes available");
    assert_eq!(stack.image_fs_usage().0, capacity);

    // The runtime names the sandbox image the script pushed: in its verbose Status before 2.0;
    // 2.x names none there and pins it instead.
    let sandbox = stack.sandbox_image();
    if stack.runtime_version() < (2, 0) {
        assert_eq!(stack.runtime_sandbox_image(), sandbox);
    } else {
        stack.pull(&sandbox);
        let pinned = stack.list_images().into_iter().any(|image| image.repo_tags.contains(&sandbox) && image.pinned);
        assert!(pinned, "containerd 2.x pins its sandbox image");
    }
}

#[test]
fn a_pull_takes_about_twice_the_listed_size_of_a_sized_image_and_removal_gives_it_back() {
    let Some(stack) = small_stack(48) else { return };
    for (name, bytes) in [("gc/four:1", 4 * MIB), ("gc/one:1", MIB)] {
        stack.seed_sized(name, bytes);
        let image = stack.image(name);
        let (_, before) = stack.image_fs_usage();
        let id = stack.pull(&image);
        let (_, after_pull) = stack.image_fs_usage();

        let listed = stack.list_images().into_iter().find(|listed| listed.id == id).expect("the image is listed");
        assert_eq!(listed.repo_tags, [image.as_str()]);
        assert!(
            (bytes..bytes + 8 * KIB).contains(&listed.size),
            "{name}: ListImages size {} for {bytes} random bytes",
            listed.size
        );
        // The compressed blob in the content store and the unpacked native snapshot, plus
        // metadata: the manifest, the config, containerd's bolt database growing.
        let taken = before - after_pull;
        assert!(
            (2 * bytes..2 * bytes + 512 * KIB).contains(&taken),
            "{name}: a pull of {} listed bytes took {taken} bytes of the image filesystem",
            listed.size
        );

        // CRI RemoveImage collects content and snapshot at once (containerd 1.6 deletes
        // synchronously); only the grown bolt database keeps its pages.
        stack.remove_image(&image);
        let (_, after_removal) = stack.image_fs_usage();
        assert!(
            after_removal + 512 * KIB >= before,
            "{name}: removal gave back {} of {taken} bytes",
            after_removal - after_pull
        );
    }
}

#[test]
fn a_container_of_a_sized_image_runs_and_a_created_one_waits_on_the_default_stack() {
    let Some(stack) = LocalStack::start_with(StackOptions::default()) else { return };
    assert!(stack.image_fs.is_none());
    stack.seed_sized("gc/run:1", MIB);
    stack.seed_sized("gc/wait:1", 0);
    let (run_image, wait_image) = (stack.image("gc/run:1"), stack.image("gc/wait:1"));
    let run_id = stack.pull(&run_image);
    let wait_id = stack.pull(&wait_image);

    let running = stack.run_container(&run_image);
    let created = stack.create_container(&wait_image);
    assert_eq!(stack.container_state(&running), "CONTAINER_RUNNING");
    assert_eq!(stack.container_state(&created), "CONTAINER_CREATED");
    let listed = stack.list_containers();
    let image_ref = |id: &str| listed.iter().find(|c| c.id == id).map(|c| c.image_ref.clone());
    assert_eq!(image_ref(&running.id), Some(run_id), "{listed:?}");
    assert_eq!(image_ref(&created.id), Some(wait_id), "{listed:?}");
    assert_ne!(running.pod_id, created.pod_id, "a pod per container");

    // RunPodSandbox pulled the sandbox image; ListImages shows it.
    let sandbox = stack.sandbox_image();
    assert!(stack.list_images().iter().any(|image| image.repo_tags.contains(&sandbox)), "{sandbox} is listed");

    // Stopped, the container stays (EXITED) until removed, with its pod.
    stack.stop_container(&running);
    assert_eq!(stack.container_state(&running), "CONTAINER_EXITED");
    stack.remove_container(running.clone());
    let left: Vec<String> = stack.list_containers().into_iter().map(|c| c.id).collect();
    assert_eq!(left, [created.id.as_str()]);
}

#[test]
fn dropping_the_stack_leaves_no_process_mount_or_cgroup_behind() {
    let Some(stack) = small_stack(16) else { return };
    stack.seed_sized("gc/leak:1", 64 * KIB);
    let image = stack.image("gc/leak:1");
    stack.pull(&image);
    let _running = stack.run_container(&image);
    let _created = stack.create_container(&image);

    let processes = stack.processes();
    let named = |name: &str| processes.iter().filter(|(_, comm)| comm == name).count();
    assert_eq!((named("containerd"), named("docker-registry")), (1, 1), "{processes:?}");
    // One shim per pod ("containerd-shim-runc-v2", cut to 15 bytes); two pause containers (one
    // per pod) and the running container.
    assert_eq!(named("containerd-shim"), 2, "{processes:?}");
    assert_eq!(named("sleep-forever"), 3, "{processes:?}");
    let dir = stack.dir().to_owned();
    assert!(!stack.mounts().is_empty());
    let cgroups = cgroup_dirs(&stack.cgroup_parent);
    assert!(!cgroups.is_empty(), "pods run in the stack's cgroup {}", stack.cgroup_parent);

    drop(stack);

    let survivors: Vec<_> = processes
        .iter()
        .filter(|(pid, comm)| {
            alive(*pid) && std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|now| now.trim() == comm)
        })
        .collect();
    assert!(survivors.is_empty(), "still running after stop: {survivors:?}");
    assert_eq!(mounts_below(&dir), Vec::<PathBuf>::new());
    let left: Vec<_> = cgroups.iter().filter(|dir| dir.exists()).collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}
