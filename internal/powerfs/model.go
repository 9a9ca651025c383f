package powerfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// chunkSize is the unit in which file data is kept and shared between the
// live and the durable state. An fsync shares the chunks written since the
// last one; the next write into a shared chunk copies it.
const chunkSize = 64 << 10

// data is a file's content: chunks by index (a missing chunk reads as zeros)
// and a size. Bytes at or past size in the last chunk are always zero.
type data struct {
	chunks map[int64][]byte
	size   int64
}

// inode is a file or a directory, with its live state and its durable state.
type inode struct {
	ino  uint64
	mode uint32 // S_IFREG or S_IFDIR, and permission bits
	uid  uint32
	gid  uint32

	mtime, ctime time.Time
	nlink        uint32 // live entries naming it (a directory counts its own 2)
	lookups      uint64 // the kernel's references (LOOKUP, CREATE, MKDIR minus FORGET)

	// A file's data. shared holds the live chunks that durable references too
	// (copy before writing into one); dirty the chunk indexes written or
	// removed since the last fsync.
	live, durable data
	shared, dirty map[int64]bool

	// A directory's entries.
	entries, durEntries map[string]*inode
}

func (n *inode) isDir() bool { return n.mode&syscall.S_IFMT == syscall.S_IFDIR }

func newFile(ino uint64, mode uint32) *inode {
	now := time.Now()
	return &inode{
		ino: ino, mode: syscall.S_IFREG | mode&0o7777, nlink: 1, mtime: now, ctime: now,
		live:    data{chunks: map[int64][]byte{}},
		durable: data{chunks: map[int64][]byte{}},
		shared:  map[int64]bool{}, dirty: map[int64]bool{},
	}
}

func newDir(ino uint64, mode uint32) *inode {
	now := time.Now()
	return &inode{
		ino: ino, mode: syscall.S_IFDIR | mode&0o7777, nlink: 2, mtime: now, ctime: now,
		entries: map[string]*inode{}, durEntries: map[string]*inode{},
	}
}

// chunkForWrite returns live chunk i, made private to the live state and
// marked dirty, creating it (zeros) if missing.
func (n *inode) chunkForWrite(i int64) []byte {
	c, ok := n.live.chunks[i]
	switch {
	case !ok:
		c = make([]byte, chunkSize)
		n.live.chunks[i] = c
	case n.shared[i]:
		c = bytes.Clone(c)
		n.live.chunks[i] = c
		delete(n.shared, i)
	}
	n.dirty[i] = true
	return c
}

// write writes p at off into the live data, growing the file.
func (n *inode) write(p []byte, off int64) {
	for len(p) > 0 {
		i, in := off/chunkSize, off%chunkSize
		c := n.chunkForWrite(i)
		k := copy(c[in:], p)
		p, off = p[k:], off+int64(k)
	}
	n.live.size = max(n.live.size, off)
	n.mtime = time.Now()
}

// read copies live data at off into p and returns how many bytes it read.
func (n *inode) read(p []byte, off int64) int {
	if off >= n.live.size {
		return 0
	}
	p = p[:min(int64(len(p)), n.live.size-off)]
	for done := 0; done < len(p); {
		pos := off + int64(done)
		i, in := pos/chunkSize, pos%chunkSize
		k := min(len(p)-done, int(chunkSize-in))
		if c, ok := n.live.chunks[i]; ok {
			copy(p[done:done+k], c[in:])
		} else {
			clear(p[done : done+k])
		}
		done += k
	}
	return len(p)
}

// zero makes the live bytes [off, end) zeros, within the current size.
func (n *inode) zero(off, end int64) {
	end = min(end, n.live.size)
	for off < end {
		i, in := off/chunkSize, off%chunkSize
		k := min(end-off, chunkSize-in)
		if in == 0 && k == chunkSize {
			n.dropChunk(i)
		} else if _, ok := n.live.chunks[i]; ok {
			clear(n.chunkForWrite(i)[in : in+k])
		}
		off += k
	}
}

func (n *inode) dropChunk(i int64) {
	if _, ok := n.live.chunks[i]; ok {
		delete(n.live.chunks, i)
		delete(n.shared, i)
		n.dirty[i] = true
	}
}

// truncate sets the live size, dropping the chunks past it and zeroing the
// tail of the last one, so that a later growth reads zeros.
func (n *inode) truncate(size int64) {
	if size < n.live.size {
		n.zero(size, n.live.size)
		for i := range n.live.chunks {
			if i*chunkSize >= size {
				n.dropChunk(i)
			}
		}
	}
	n.live.size = size
	n.mtime = time.Now()
}

// syncData makes the live data durable: the chunks written since the last
// sync become shared with the durable state.
func (n *inode) syncData() {
	for i := range n.dirty {
		if c, ok := n.live.chunks[i]; ok {
			n.durable.chunks[i] = c
			n.shared[i] = true
		} else {
			delete(n.durable.chunks, i)
		}
	}
	clear(n.dirty)
	n.durable.size = n.live.size
}

// syncEntries makes the live entries of a directory durable.
func (n *inode) syncEntries() {
	clear(n.durEntries)
	for name, c := range n.entries {
		n.durEntries[name] = c
	}
}

// blocks is the allocated size in 512-byte blocks, as stat reports it.
func (n *inode) blocks() uint64 {
	if n.isDir() {
		return 8
	}
	return uint64(len(n.live.chunks)) * chunkSize / 512
}

// load reads the tree at path into dir, as both its live and durable state.
func load(dir *inode, path string, newIno func() uint64) error {
	ents, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(path, e.Name())
		fi, err := e.Info()
		if err != nil {
			return err
		}
		var child *inode
		switch {
		case fi.IsDir():
			child = newDir(newIno(), uint32(fi.Mode().Perm()))
			if err := load(child, p, newIno); err != nil {
				return err
			}
			dir.nlink++
		case fi.Mode().IsRegular():
			child = newFile(newIno(), uint32(fi.Mode().Perm()))
			if err := loadFile(child, p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("powerfs: %s is neither a file nor a directory", p)
		}
		dir.entries[e.Name()] = child
		dir.durEntries[e.Name()] = child
	}
	return nil
}

// loadFile reads the file at path into n, live and durable. Chunks of zeros
// stay holes.
func loadFile(n *inode, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zeros := make([]byte, chunkSize)
	for i := int64(0); ; i++ {
		c := make([]byte, chunkSize)
		k, err := io.ReadFull(f, c)
		if k > 0 && !bytes.Equal(c, zeros) {
			n.live.chunks[i] = c
			n.durable.chunks[i] = c
			n.shared[i] = true
		}
		n.live.size += int64(k)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	n.durable.size = n.live.size
	return nil
}

// writeDurable writes the durable content of directory dir into path, which
// it creates. on holds the directories on the way from the root: a directory
// durably inside itself (renames of directories made durable in one parent
// and not the other) is written once.
func writeDurable(dir *inode, path string, on map[*inode]bool) error {
	if err := os.Mkdir(path, os.FileMode(dir.mode&0o777)); err != nil {
		return err
	}
	on[dir] = true
	defer delete(on, dir)
	for name, c := range dir.durEntries {
		p := filepath.Join(path, name)
		if c.isDir() {
			if on[c] {
				continue
			}
			if err := writeDurable(c, p, on); err != nil {
				return err
			}
			continue
		}
		if err := writeDurableFile(c, p); err != nil {
			return err
		}
	}
	return nil
}

func writeDurableFile(n *inode, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(n.mode&0o777))
	if err != nil {
		return err
	}
	for i, c := range n.durable.chunks {
		off := i * chunkSize
		if off >= n.durable.size {
			continue
		}
		if _, err := f.WriteAt(c[:min(chunkSize, n.durable.size-off)], off); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Truncate(n.durable.size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
