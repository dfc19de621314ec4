//! The long help of the commands for people: what each column of a listing means (and what its
//! `-` or `never` says), then the exit statuses every command that talks to the daemon shares.

/// The exit statuses, as a literal that the help texts below end with.
macro_rules! exit_status_help {
    () => {
        "\
Exit status:
  0    done
  1    the daemon refused or failed (the kubelet's reason and message are printed)
  2    the command line cannot be used
  3    the daemon cannot be reached (no socket, nothing listening, it stopped)
  4    permission denied: on the socket or its directory, or the caller's role does not allow
       the command (the daemon names the role it needs: see --role)
  5    the daemon is too old for this command
  6    try again later (backing off, over a registry's rate limit)
  130  interrupted (Ctrl-C, SIGTERM, SIGHUP)"
    };
}

/// The exit statuses every command that talks to the daemon shares.
pub const EXIT_STATUS_HELP: &str = exit_status_help!();

/// `images --help`: the columns, then the exit statuses.
pub const IMAGES_HELP: &str = concat!(
    "\
Columns:
  IMAGE      a name of the image (a row per tag, else per digest), with its runtime handler
  IMAGE ID   the image's id, shortened
  SIZE       its size as the runtime reports it
  AGE        since image GC first saw it on the node; it looks every --image-gc-period (5m by
             default) and at each `cri-imaged gc`: `-` until then, as for an image just pulled
  LAST USED  when image GC last saw a container use it: `now` while one does, `never` if none
             has since cri-imaged started keeping ages (an image just pulled, before its
             container starts)
  PINNED     never removed by image GC (the sandbox image, --pinned-image)
  IN USE     a container (in any state) uses it
  VERIFIED   the image policies it was verified under (default, ns:NAMESPACE); `-` for none

",
    exit_status_help!()
);

/// `backoff --help`: the columns, then the exit statuses.
pub const BACKOFF_HELP: &str = concat!(
    "\
Columns:
  POD         the pod (namespace/name) whose pulls back off
  POD UID     its uid, as `cri-imaged backoff clear POD_UID IMAGE` takes it
  IMAGE       the image as the pod wrote it, with its runtime handler
  RETRY IN    how long until its next pull is tried
  DELAY       the current delay, doubled at each failure up to --image-pull-backoff-max
  LAST ERROR  why its last pull failed

",
    exit_status_help!()
);

/// `gc --help`: the columns of each table, then the exit statuses.
pub const GC_HELP: &str = concat!(
    "\
Columns of the images removed (or, with --dry-run, that would be):
  IMAGE      the image's first name (`<none>` for one without)
  IMAGE ID   its id, shortened
  SIZE       the bytes its removal frees
  WHY        space (the disk at or above the high threshold), age (unused longer than
             --image-maximum-gc-age) or unused (a pass asked to remove every unused image)
  LAST USED  when a container last used it, as image GC saw; `never` if none has since
             cri-imaged started keeping ages
  RESULT     removed, would be removed, or kept and why (handed out or pulled during the
             pass, or the runtime's error)
Columns of the images kept (KEPT, IMAGE ID, SIZE as above):
  WHY        why it stays: in use (by a container), pinned, sandbox image, young (first seen
             less than --minimum-image-ttl-duration ago), held (handed out, being pulled, or
             kept for a pre-pull), or not needed (enough was freed without it, or the disk is
             below the high threshold and the image younger than --image-maximum-gc-age)

",
    exit_status_help!()
);

/// `prepull --help`: the columns, then the exit statuses.
pub const PREPULL_HELP: &str = concat!(
    "\
Columns of the pre-pulls listed:
  ID         the pre-pull's id, as the API's CancelPrePull takes it
  IMAGE      the image, with its runtime handler
  NAMESPACE  the namespace whose image policy admits it; `-` for none (the default policy)
  STATE      queued, pulling, held, done, failed or cancelled; (declared): from --pre-pull
  PRIORITY   higher goes first
  AGE        since it was asked for
  DETAIL     why it failed or is held, what it pulled (done), or how far it got (pulling)

",
    exit_status_help!()
);

/// `status --help`: the pulls' columns, then the exit statuses.
pub const STATUS_HELP: &str = concat!(
    "\
The pulls' columns (shown while pulls are under way or queued):
  IMAGE     the image as the runtime is asked for it; (pre-pull): one no pod has joined
  STATE     waiting for a slot, rate limited, registry silent (a pull of it has no answer),
            or pulling
  CALLERS   how many requests wait for this pull
  ASKED     since the first of them asked
  PROGRESS  bytes done of the total, the share, and the rate; `-` before the sizes are known

",
    exit_status_help!()
);
