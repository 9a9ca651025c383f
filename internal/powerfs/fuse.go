package powerfs

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Options configures Mount.
type Options struct {
	// Seed is a directory whose tree the filesystem starts with, all of it
	// durable (the state recovered after an earlier cut). Empty means an empty
	// filesystem.
	Seed string
	// UnmountTimeout bounds how long Unmount and Cut retry while the mount is
	// busy. Zero means 30 s.
	UnmountTimeout time.Duration
	// Debug logs every FUSE request (go-fuse's log).
	Debug bool
}

// attrTimeout is how long the kernel may cache names and attributes. Every
// change goes through the kernel, so its cache stays right.
const attrTimeout = time.Second

// FS is a mounted power-loss filesystem.
type FS struct {
	mountpoint string
	opts       Options
	server     *fuse.Server
	served     chan struct{} // closed when the server loop has returned

	mu      sync.Mutex
	cut     bool // every operation fails from now on
	nextIno uint64
	inodes  map[uint64]*inode // by the kernel's node id, while it holds references
	root    *inode
	dirs    map[uint64][]fuse.DirEntry // open directory handles: the entries at open
	nextFh  uint64
	unmount sync.Once
	umErr   error
}

var _ fuse.RawFileSystem = (*server)(nil)

// Mount mounts a new FS at mountpoint, an existing empty directory, and
// serves it until Unmount or Cut. It needs root and /dev/fuse.
func Mount(mountpoint string, opts Options) (*FS, error) {
	if opts.UnmountTimeout == 0 {
		opts.UnmountTimeout = 30 * time.Second
	}
	if err := checkMountpoint(mountpoint); err != nil {
		return nil, err
	}
	f := &FS{mountpoint: mountpoint, opts: opts, inodes: map[uint64]*inode{}, dirs: map[uint64][]fuse.DirEntry{}, nextIno: fuse.FUSE_ROOT_ID}
	f.root = newDir(f.newIno(), 0o755)
	f.root.lookups = 1 // the kernel never forgets the root
	f.inodes[f.root.ino] = f.root
	if opts.Seed != "" {
		if err := load(f.root, opts.Seed, f.newIno); err != nil {
			return nil, fmt.Errorf("powerfs: load %s: %w", opts.Seed, err)
		}
	}
	srv, err := fuse.NewServer(&server{fs: f, RawFileSystem: fuse.NewDefaultRawFileSystem()}, mountpoint, &fuse.MountOptions{
		DirectMount:        true,
		DirectMountStrict:  true,
		FsName:             "powerfs",
		Name:               "powerfs",
		DisableReadDirPlus: true,
		DisableXAttrs:      true,
		MaxWrite:           1 << 20,
		Debug:              opts.Debug,
	})
	if err != nil {
		return nil, fmt.Errorf("powerfs: mount %s: %w", mountpoint, err)
	}
	f.server = srv
	f.served = make(chan struct{})
	go func() {
		defer close(f.served)
		srv.Serve()
	}()
	if err := srv.WaitMount(); err != nil {
		_ = f.Unmount()
		return nil, fmt.Errorf("powerfs: mount %s: %w", mountpoint, err)
	}
	return f, nil
}

func (f *FS) newIno() uint64 {
	n := f.nextIno
	f.nextIno++
	return n
}

// Unmount unmounts the filesystem, retrying while it is busy (a process still
// has a file open in it) for up to Options.UnmountTimeout, and waits for the
// server loop. What was not made durable is kept in the live view until then;
// it is not written anywhere.
func (f *FS) Unmount() error {
	f.unmount.Do(func() {
		deadline := time.Now().Add(f.opts.UnmountTimeout)
		for {
			err := syscall.Unmount(f.mountpoint, 0)
			if err == nil {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				f.umErr = fmt.Errorf("powerfs: unmount %s: %w", f.mountpoint, err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		<-f.served
	})
	return f.umErr
}

// Cut cuts the power: from this instant every operation on the mount fails
// with EIO, and nothing more becomes durable. Cut then calls stop, which must
// end every process that uses the mount (and wait for it) and close what the
// caller itself holds open in it; unmounts; and writes the durable state into
// the directory recovered, which must not exist yet (it may be inside
// Options.Seed's parent, or be a new name for the next Mount's Seed).
func (f *FS) Cut(stop func(), recovered string) error {
	f.mu.Lock()
	f.cut = true
	f.mu.Unlock()
	if stop != nil {
		stop()
	}
	if err := f.Unmount(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := writeDurable(f.root, recovered, map[*inode]bool{}); err != nil {
		return fmt.Errorf("powerfs: write the durable state to %s: %w", recovered, err)
	}
	return nil
}

// server serves the kernel's requests. Every method takes fs.mu and fails
// with EIO once the power is cut.
type server struct {
	fuse.RawFileSystem
	fs *FS
}

func (s *server) String() string { return "powerfs" }

// lock takes the FS lock; it returns false, with the lock released, once the
// power is cut.
func (s *server) lock() bool {
	s.fs.mu.Lock()
	if s.fs.cut {
		s.fs.mu.Unlock()
		return false
	}
	return true
}

func (s *server) unlock() { s.fs.mu.Unlock() }

func (s *server) node(id uint64) (*inode, fuse.Status) {
	n, ok := s.fs.inodes[id]
	if !ok {
		return nil, fuse.ENOENT
	}
	return n, fuse.OK
}

func (s *server) dir(id uint64) (*inode, fuse.Status) {
	n, st := s.node(id)
	if !st.Ok() {
		return nil, st
	}
	if !n.isDir() {
		return nil, fuse.ENOTDIR
	}
	return n, fuse.OK
}

func fillAttr(n *inode, a *fuse.Attr) {
	*a = fuse.Attr{Ino: n.ino, Mode: n.mode, Nlink: n.nlink, Blksize: 4096, Blocks: n.blocks()}
	a.Owner = fuse.Owner{Uid: n.uid, Gid: n.gid}
	if n.isDir() {
		a.Size = 4096
	} else {
		a.Size = uint64(n.live.size)
	}
	a.SetTimes(&n.mtime, &n.mtime, &n.ctime)
}

// entry fills out for n and counts the kernel's new reference to it.
func (s *server) entry(n *inode, out *fuse.EntryOut) {
	n.lookups++
	s.fs.inodes[n.ino] = n
	out.NodeId = n.ino
	out.SetEntryTimeout(attrTimeout)
	out.SetAttrTimeout(attrTimeout)
	fillAttr(n, &out.Attr)
}

func (s *server) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	d, st := s.dir(h.NodeId)
	if !st.Ok() {
		return st
	}
	c, ok := d.entries[name]
	if !ok {
		return fuse.ENOENT
	}
	s.entry(c, out)
	return fuse.OK
}

func (s *server) Forget(id, nlookup uint64) {
	s.fs.mu.Lock()
	defer s.fs.mu.Unlock()
	n, ok := s.fs.inodes[id]
	if !ok || n == s.fs.root {
		return
	}
	n.lookups -= min(nlookup, n.lookups)
	if n.lookups == 0 {
		// The inode lives on where entries (live or durable) hold it.
		delete(s.fs.inodes, id)
	}
}

func (s *server) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	fillAttr(n, &out.Attr)
	out.SetTimeout(attrTimeout)
	return fuse.OK
}

func (s *server) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	if sz, ok := in.GetSize(); ok {
		if n.isDir() {
			return fuse.Status(syscall.EISDIR)
		}
		n.truncate(int64(sz))
	}
	if m, ok := in.GetMode(); ok {
		n.mode = n.mode&syscall.S_IFMT | m&0o7777
	}
	if uid, ok := in.GetUID(); ok {
		n.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		n.gid = gid
	}
	if mt, ok := in.GetMTime(); ok {
		n.mtime = mt
	}
	n.ctime = time.Now()
	fillAttr(n, &out.Attr)
	out.SetTimeout(attrTimeout)
	return fuse.OK
}

func (s *server) Access(<-chan struct{}, *fuse.AccessIn) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	s.unlock()
	return fuse.OK
}

// link adds a new child to d under name.
func (s *server) link(d *inode, name string, c *inode, caller fuse.Caller) fuse.Status {
	if _, ok := d.entries[name]; ok {
		return fuse.Status(syscall.EEXIST)
	}
	c.uid, c.gid = caller.Uid, caller.Gid
	d.entries[name] = c
	d.mtime = time.Now()
	if c.isDir() {
		d.nlink++
	}
	return fuse.OK
}

func (s *server) Mkdir(_ <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	d, st := s.dir(in.NodeId)
	if !st.Ok() {
		return st
	}
	c := newDir(s.fs.newIno(), in.Mode&^in.Umask)
	if st := s.link(d, name, c, in.Caller); !st.Ok() {
		return st
	}
	s.entry(c, out)
	return fuse.OK
}

func (s *server) Create(_ <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	if in.Flags&syscall.O_DIRECT != 0 {
		return fuse.EINVAL
	}
	d, st := s.dir(in.NodeId)
	if !st.Ok() {
		return st
	}
	c := newFile(s.fs.newIno(), in.Mode&^in.Umask)
	if st := s.link(d, name, c, in.Caller); !st.Ok() {
		return st
	}
	s.entry(c, &out.EntryOut)
	return fuse.OK
}

func (s *server) Mknod(<-chan struct{}, *fuse.MknodIn, string, *fuse.EntryOut) fuse.Status {
	return fuse.Status(syscall.EPERM)
}

func (s *server) Link(<-chan struct{}, *fuse.LinkIn, string, *fuse.EntryOut) fuse.Status {
	return fuse.Status(syscall.EPERM)
}

func (s *server) Symlink(<-chan struct{}, *fuse.InHeader, string, string, *fuse.EntryOut) fuse.Status {
	return fuse.Status(syscall.EPERM)
}

// remove takes name out of d: an unlink (dir false) or an rmdir (dir true).
func (s *server) remove(id uint64, name string, dir bool) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	d, st := s.dir(id)
	if !st.Ok() {
		return st
	}
	c, ok := d.entries[name]
	switch {
	case !ok:
		return fuse.ENOENT
	case dir && !c.isDir():
		return fuse.ENOTDIR
	case !dir && c.isDir():
		return fuse.Status(syscall.EISDIR)
	case dir && len(c.entries) > 0:
		return fuse.Status(syscall.ENOTEMPTY)
	}
	delete(d.entries, name)
	d.mtime = time.Now()
	if dir {
		d.nlink--
		c.nlink = 0
	} else {
		c.nlink--
	}
	c.ctime = time.Now()
	return fuse.OK
}

func (s *server) Unlink(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return s.remove(h.NodeId, name, false)
}

func (s *server) Rmdir(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return s.remove(h.NodeId, name, true)
}

const renameNoReplace = 1 // RENAME_NOREPLACE

func (s *server) Rename(_ <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	if in.Flags&^renameNoReplace != 0 {
		return fuse.EINVAL
	}
	from, st := s.dir(in.NodeId)
	if !st.Ok() {
		return st
	}
	to, st := s.dir(in.Newdir)
	if !st.Ok() {
		return st
	}
	c, ok := from.entries[oldName]
	if !ok {
		return fuse.ENOENT
	}
	if old, ok := to.entries[newName]; ok {
		switch {
		case old == c:
			return fuse.OK
		case in.Flags&renameNoReplace != 0:
			return fuse.Status(syscall.EEXIST)
		case c.isDir() && !old.isDir():
			return fuse.ENOTDIR
		case !c.isDir() && old.isDir():
			return fuse.Status(syscall.EISDIR)
		case old.isDir() && len(old.entries) > 0:
			return fuse.Status(syscall.ENOTEMPTY)
		}
		if old.isDir() {
			to.nlink--
			old.nlink = 0
		} else {
			old.nlink--
		}
		old.ctime = time.Now()
	}
	delete(from.entries, oldName)
	to.entries[newName] = c
	if c.isDir() {
		from.nlink--
		to.nlink++
	}
	now := time.Now()
	from.mtime, to.mtime, c.ctime = now, now, now
	return fuse.OK
}

func (s *server) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	if in.Flags&syscall.O_DIRECT != 0 {
		return fuse.EINVAL
	}
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	if n.isDir() {
		return fuse.Status(syscall.EISDIR)
	}
	return fuse.OK
}

func (s *server) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if !s.lock() {
		return nil, fuse.EIO
	}
	defer s.unlock()
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return nil, st
	}
	k := n.read(buf[:min(len(buf), int(in.Size))], int64(in.Offset))
	return fuse.ReadResultData(buf[:k]), fuse.OK
}

func (s *server) Write(_ <-chan struct{}, in *fuse.WriteIn, p []byte) (uint32, fuse.Status) {
	if !s.lock() {
		return 0, fuse.EIO
	}
	defer s.unlock()
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return 0, st
	}
	n.write(p, int64(in.Offset))
	return uint32(len(p)), fuse.OK
}

func (s *server) Writev(_ <-chan struct{}, in *fuse.WriteIn, ps [][]byte) (uint32, fuse.Status) {
	if !s.lock() {
		return 0, fuse.EIO
	}
	defer s.unlock()
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return 0, st
	}
	off := int64(in.Offset)
	for _, p := range ps {
		n.write(p, off)
		off += int64(len(p))
	}
	return uint32(off - int64(in.Offset)), fuse.OK
}

// Fallocate modes (linux/falloc.h).
const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
)

func (s *server) Fallocate(_ <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	off, end := int64(in.Offset), int64(in.Offset+in.Length)
	switch in.Mode &^ fallocKeepSize {
	case 0:
	case fallocPunchHole:
		if in.Mode&fallocKeepSize == 0 {
			return fuse.EINVAL
		}
		n.zero(off, end)
	case fallocZeroRange:
		n.zero(off, end)
	default:
		return fuse.ENOTSUP
	}
	if in.Mode&fallocKeepSize == 0 && end > n.live.size {
		n.live.size = end
	}
	n.mtime = time.Now()
	return fuse.OK
}

func (s *server) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	s.unlock()
	return fuse.OK
}

func (s *server) Release(<-chan struct{}, *fuse.ReleaseIn) {}

// Fsync makes the file's live data and size durable (fsync and fdatasync
// alike: the size is part of the data a later read needs).
func (s *server) Fsync(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	n, st := s.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	if n.isDir() {
		n.syncEntries()
	} else {
		n.syncData()
	}
	return fuse.OK
}

func (s *server) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	d, st := s.dir(in.NodeId)
	if !st.Ok() {
		return st
	}
	ents := make([]fuse.DirEntry, 0, len(d.entries))
	for name, c := range d.entries {
		ents = append(ents, fuse.DirEntry{Name: name, Ino: c.ino, Mode: c.mode})
	}
	slices.SortFunc(ents, func(a, b fuse.DirEntry) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	s.fs.nextFh++
	s.fs.dirs[s.fs.nextFh] = ents
	out.Fh = s.fs.nextFh
	return fuse.OK
}

func (s *server) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	ents, ok := s.fs.dirs[in.Fh]
	if !ok {
		return fuse.EBADF
	}
	for i := int(in.Offset); i < len(ents); i++ {
		e := ents[i]
		e.Off = uint64(i + 1)
		if !out.AddDirEntry(e) {
			break
		}
	}
	return fuse.OK
}

func (s *server) ReleaseDir(in *fuse.ReleaseIn) {
	s.fs.mu.Lock()
	defer s.fs.mu.Unlock()
	delete(s.fs.dirs, in.Fh)
}

// FsyncDir makes the directory's live entries durable.
func (s *server) FsyncDir(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	d, st := s.dir(in.NodeId)
	if !st.Ok() {
		return st
	}
	d.syncEntries()
	return fuse.OK
}

func (s *server) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	if !s.lock() {
		return fuse.EIO
	}
	defer s.unlock()
	*out = fuse.StatfsOut{Blocks: 1 << 30, Bfree: 1 << 29, Bavail: 1 << 29, Files: 1 << 20, Ffree: 1 << 20, Bsize: 4096, Frsize: 4096, NameLen: 255}
	return fuse.OK
}

// checkMountpoint checks that path is a directory, for a clearer error than
// the kernel's.
func checkMountpoint(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("powerfs: mount point %s is not a directory", path)
	}
	return nil
}
