// Package powerfs is a FUSE filesystem for power-cut tests: it holds every
// file in memory, keeps apart what was written and what was made durable, and
// at Cut throws away everything that was not, as a power loss would.
//
// The rules are POSIX's promise, stricter than most real filesystems keep:
//
//   - A file's data, and its size, become durable only when that file is
//     fsynced or fdatasynced (msync of a shared mapping ends in an fsync too).
//   - A directory entry (a create, a mkdir, a rename into or out of the
//     directory, an unlink, an rmdir) becomes durable only when its parent
//     directory is fsynced; the directory then durably holds exactly the
//     entries it holds live.
//   - A file is in the durable state only if every directory entry on its path
//     from the root is durable: a file created, written and fsynced in a
//     directory that was never fsynced is gone after the cut.
//
// The live view behaves like a normal filesystem for what Badger, the
// write-ahead log and Go's os package need: files and directories, read,
// write, truncate, fallocate (modes 0, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE),
// rename (flags 0 and RENAME_NOREPLACE), unlink, rmdir, readdir, getattr,
// setattr, fsync and fdatasync of files and directories. There are no hard
// links, symbolic links, device nodes, extended attributes or locks. Files are
// not opened with direct_io, so shared writable mappings work; their pages
// reach the filesystem at msync, munmap or the kernel's writeback, in the
// order a disk would see them. O_DIRECT opens are refused with EINVAL (the
// write-ahead log falls back to buffered writes and fdatasync): the kernel's
// handling of RWF_DSYNC on a FUSE file is not something the model should
// depend on.
//
// Durable file data is kept in copy-on-write chunks shared with the live
// data, so an fsync costs the chunks written since the last one, not the file.
//
// Concurrency: the kernel's requests are served on go-fuse's goroutines, all
// under one mutex of the FS. Mount starts the server goroutine; Unmount and
// Cut stop it and wait for it.
package powerfs
