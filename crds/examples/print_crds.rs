//! Prints every generated CRD as YAML (the same text `tuna-operator crdgen` writes).
fn main() -> Result<(), tuna_crds::Error> {
    for crd in tuna_crds::render_all()? {
        println!("--- # {}\n{}", crd.file_name, crd.yaml);
    }
    Ok(())
}
