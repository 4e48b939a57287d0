//! The catalog of a restore: which stores, ranks and versions exist, and
//! the diff files it keeps open (at most `MAX_OPEN_FILES`).

use super::*;

impl Catalog {
    /// A catalog over the store root `root` (a POSIX directory).
    pub fn new(root: &Path) -> Self {
        Self::on(Arc::new(Posix::at(root)))
    }

    /// A catalog over a store on any storage.
    pub fn on(storage: Arc<dyn Storage>) -> Self {
        Catalog {
            root: storage.locate(Path::new("")),
            storage,
            commits: None,
            stores: HashMap::new(),
            readers: HashMap::new(),
            open: VecDeque::new(),
        }
    }

    /// The store root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The store of `rank` (its manifest rolled forward from the commit records).
    pub fn store(&mut self, rank: u32) -> Result<&Store> {
        if self.commits.is_none() {
            self.commits = Some(CommitLog::load_from(self.storage.as_ref())?);
        }
        let log = self.commits.as_ref().ok_or_else(|| Error::Internal("commit log".into()))?;
        match self.stores.entry(rank) {
            Entry::Occupied(o) => Ok(o.into_mut()),
            Entry::Vacant(v) => Ok(v.insert(Store::open_in(self.storage.clone(), rank, log)?)),
        }
    }

    /// The verified-metadata reader of `(rank, version)`; the version must be
    /// committed for that rank and its file must match the committed entry.
    pub fn reader(&mut self, rank: u32, version: u64) -> Result<&DiffReader> {
        let key = (rank, version);
        if !self.readers.contains_key(&key) {
            let reader = self.opening(rank, version)?.open()?;
            self.readers.insert(key, reader);
        }
        self.touch(key);
        self.readers.get(&key).ok_or_else(|| Error::Internal("reader cache".into()))
    }

    /// The reader of `(rank, version)` if it is open already
    /// ([`Catalog::preload`]).
    pub fn loaded(&self, rank: u32, version: u64) -> Option<&DiffReader> {
        self.readers.get(&(rank, version))
    }

    /// Opens the readers of `versions` of `rank` not open yet, in parallel
    /// (each parses and checks a file's tables: a chain's files are
    /// independent). The first error, if any.
    pub fn preload(&mut self, rank: u32, versions: &[u64]) -> Result<()> {
        let missing: Vec<u64> = versions.iter().copied().filter(|&v| !self.readers.contains_key(&(rank, v))).collect();
        let wanted: Vec<ReaderOpening> = missing.into_iter().map(|v| self.opening(rank, v)).collect::<Result<_>>()?;
        let opened: Vec<DiffReader> = wanted.into_par_iter().map(ReaderOpening::open).collect::<Result<_>>()?;
        self.keep_opened(opened);
        Ok(())
    }

    /// Adds readers opened apart (each most recently used, in order).
    fn keep_opened(&mut self, opened: Vec<DiffReader>) {
        for reader in opened {
            let key = (reader.header.rank, reader.header.version);
            self.readers.insert(key, reader);
            self.touch(key);
        }
    }

    /// Opens the readers of `files` (`(rank, version)`, any ranks) not open
    /// yet, in parallel, as far as they open: a file that does not is left
    /// for [`Catalog::reader`] (or [`owner_reader`]) to open again and name
    /// in its error. What a restore does before it reads other ranks'
    /// files (each parses and checks a file's tables).
    pub fn preload_files(&mut self, files: &[(u32, u64)]) {
        let missing: Vec<(u32, u64)> = files.iter().copied().filter(|key| !self.readers.contains_key(key)).collect();
        // At most MAX_OPEN_FILES at once: each open reader holds its file.
        for batch in missing.chunks(MAX_OPEN_FILES) {
            let wanted: Vec<ReaderOpening> =
                batch.iter().filter_map(|&(rank, version)| self.opening(rank, version).ok()).collect();
            let opened: Vec<DiffReader> = wanted.into_par_iter().filter_map(|o| o.open().ok()).collect();
            self.keep_opened(opened);
        }
    }

    /// What opening the reader of `(rank, version)` needs from its store.
    pub(super) fn opening(&mut self, rank: u32, version: u64) -> Result<ReaderOpening> {
        let store = self.store(rank)?;
        let entry = store.manifest().get(version).cloned().ok_or_else(|| Error::MissingVersion {
            dir: store.root().to_path_buf(),
            rank,
            version,
        })?;
        Ok(ReaderOpening {
            storage: store.storage().clone(),
            rel: store.diff_rel(version),
            path: store.diff_path(version),
            rank,
            version,
            layout: store.layout()?,
            hash: store.manifest().hash,
            method: store.manifest().method,
            entry,
        })
    }

    /// Marks `key` most recently used; closes the files of the least
    /// recently used readers beyond [`MAX_OPEN_FILES`].
    pub(super) fn touch(&mut self, key: (u32, u64)) {
        if self.open.back() == Some(&key) {
            return;
        }
        if let Some(i) = self.open.iter().position(|k| *k == key) {
            self.open.remove(i);
        }
        self.open.push_back(key);
        while self.open.len() > MAX_OPEN_FILES {
            if let Some(old) = self.open.pop_front()
                && let Some(r) = self.readers.get(&old)
            {
                r.release_file();
            }
        }
    }

    /// Number of diff files opened so far.
    pub fn files_opened(&self) -> usize {
        self.readers.len()
    }
}

impl ReaderOpening {
    /// Opens and checks the reader: the file's rank, version and
    /// parameters, its length and checksum against the committed entry.
    pub(super) fn open(self) -> Result<DiffReader> {
        let path = &self.path;
        let reader = DiffReader::open_in(self.storage, &self.rel)?;
        let h = &reader.header;
        if h.rank != self.rank || h.version != self.version {
            return Err(Error::corrupt(path, format!("file holds rank {} version {}", h.rank, h.version)));
        }
        if reader.diff.layout != self.layout || h.hash != self.hash || h.method != self.method {
            return Err(Error::corrupt(path, "parameters differ from the manifest's"));
        }
        if reader.file_len() != self.entry.file_len || hex::encode(reader.trailer()) != self.entry.trailer {
            return Err(Error::corrupt(path, "length or checksum differs from the committed entry's"));
        }
        Ok(reader)
    }
}

/// The reader of `(owner, version)` for a restore of `rank`: a failure to open
/// another rank's file names both ranks, the version and the file.
pub fn owner_reader(catalog: &mut Catalog, rank: u32, owner: u32, version: u64) -> Result<&DiffReader> {
    if owner == rank {
        return catalog.reader(owner, version);
    }
    let path = crate::store::rank_dir(&catalog.root, owner).join(crate::store::diff_file_name(version));
    match catalog.reader(owner, version) {
        Ok(_) => catalog.reader(owner, version),
        Err(e) => {
            let reason = match e {
                Error::Io { source, .. } => source.to_string(),
                other => other.to_string(),
            };
            Err(Error::OwnerUnavailable { rank, version, owner, path, reason })
        }
    }
}
